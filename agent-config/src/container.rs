//! What a container runtime (Docker, Podman) says of a container: the
//! answer to `GET /containers/{id}/json` on its API socket, and the
//! `__meta_docker_*` labels made of it, as Grafana Alloy's
//! `discovery.docker` names them. Names, images and labels are chosen by
//! whoever started the container.

use std::collections::BTreeMap;

use crate::relabel::sanitize_name;

/// What the runtime says of one container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeContainer {
    /// As the API writes it, with its leading `/`.
    pub name: String,
    pub image: String,
    pub labels: BTreeMap<String, String>,
}

impl RuntimeContainer {
    /// The `__meta_docker_*` labels, as `discovery.docker` names them.
    pub fn meta_labels(&self, id: &str) -> Vec<(String, String)> {
        let mut labels = vec![
            ("__meta_docker_container_id".to_owned(), id.to_owned()),
            ("__meta_docker_container_name".to_owned(), self.name.clone()),
            (
                "__meta_docker_container_image".to_owned(),
                self.image.clone(),
            ),
        ];
        for (name, value) in &self.labels {
            labels.push((
                format!("__meta_docker_container_label_{}", sanitize_name(name)),
                value.clone(),
            ));
        }
        labels
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("the answer is not HTTP")]
    NotHttp,
    #[error("HTTP {status}")]
    Status { status: u16 },
    #[error("the answer is not a container")]
    Json(#[from] serde_json::Error),
}

/// A whole HTTP/1.0 answer to `GET /containers/{id}/json`: the container,
/// or `None` when the runtime does not know it (404).
pub fn parse_answer(answer: &[u8]) -> Result<Option<RuntimeContainer>, AnswerError> {
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or(AnswerError::NotHttp)?;
    let head = String::from_utf8_lossy(&answer[..split]);
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or(AnswerError::NotHttp)?;
    match status {
        200 => {}
        404 => return Ok(None),
        status => return Err(AnswerError::Status { status }),
    }
    #[derive(serde::Deserialize)]
    struct Inspect {
        #[serde(rename = "Name", default)]
        name: String,
        #[serde(rename = "Config", default)]
        config: Option<Config>,
    }
    #[derive(serde::Deserialize)]
    struct Config {
        #[serde(rename = "Image", default)]
        image: String,
        #[serde(rename = "Labels", default)]
        labels: Option<BTreeMap<String, String>>,
    }
    let inspect: Inspect = serde_json::from_slice(&answer[split + 4..])?;
    let config = inspect.config;
    Ok(Some(RuntimeContainer {
        name: inspect.name,
        image: config.as_ref().map(|c| c.image.clone()).unwrap_or_default(),
        labels: config.and_then(|c| c.labels).unwrap_or_default(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inspect_answer_gives_name_image_and_labels() {
        let answer = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"Id\":\"abc\",\"Name\":\"/shop-web\",\"Config\":{\"Image\":\"nginx:1\",\"Labels\":{\"com.example.team\":\"web\"}}}";
        let container = parse_answer(answer).expect("parses").expect("found");
        assert_eq!(container.name, "/shop-web");
        let labels = container.meta_labels("abc");
        assert!(labels.contains(&(
            "__meta_docker_container_label_com_example_team".into(),
            "web".into()
        )));
        assert!(labels.contains(&("__meta_docker_container_image".into(), "nginx:1".into())));
        assert_eq!(
            parse_answer(b"HTTP/1.0 404 Not Found\r\n\r\n{}").expect("parses"),
            None
        );
        assert!(parse_answer(b"garbage").is_err());
        assert!(matches!(
            parse_answer(b"HTTP/1.0 500 Oops\r\n\r\n"),
            Err(AnswerError::Status { status: 500 })
        ));
    }
}
