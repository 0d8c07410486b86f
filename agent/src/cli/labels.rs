//! Flags for labels: the config file with `relabel_configs`, and where the
//! Kubernetes API server is (in a pod: found from the environment).

use std::path::{Path, PathBuf};

use clap::Args;

use super::remote::ConfigError;
use crate::labels::KubernetesConfig;

const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

#[derive(Args, Debug, Clone)]
pub struct KubernetesArgs {
    /// The Kubernetes API server the pods of this node are read from
    /// (`https://host:port`). Default: in a pod, KUBERNETES_SERVICE_HOST
    /// and KUBERNETES_SERVICE_PORT; elsewhere, no pod labels.
    #[arg(long, value_name = "URL", env = "FIRN_KUBERNETES_API_SERVER")]
    pub kubernetes_api_server: Option<String>,

    /// The bearer token for the API server (read at every connection).
    /// Default: the pod's service account token.
    #[arg(long, value_name = "FILE")]
    pub kubernetes_token_file: Option<PathBuf>,

    /// The CA the API server's certificate must chain to. Default: the
    /// pod's service account CA.
    #[arg(long, value_name = "FILE")]
    pub kubernetes_ca_file: Option<PathBuf>,
}

impl KubernetesArgs {
    /// `None` outside Kubernetes (and without `--kubernetes-api-server`).
    pub fn config(&self, node: &str) -> Result<Option<KubernetesConfig>, ConfigError> {
        self.config_from(node, |name| std::env::var(name).ok())
    }

    fn config_from(
        &self,
        node: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<KubernetesConfig>, ConfigError> {
        let api_server = match &self.kubernetes_api_server {
            Some(url) => url.clone(),
            None => {
                let Some(host) = env("KUBERNETES_SERVICE_HOST").filter(|h| !h.is_empty()) else {
                    return Ok(None);
                };
                let port = env("KUBERNETES_SERVICE_PORT")
                    .filter(|p| !p.is_empty())
                    .unwrap_or_else(|| "443".into());
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host
                };
                format!("https://{host}:{port}")
            }
        };
        let default = |name: &str| {
            let path = Path::new(SERVICE_ACCOUNT).join(name);
            path.exists().then_some(path)
        };
        let ca_file = match &self.kubernetes_ca_file {
            Some(path) => {
                // Read now so a wrong path stops firn at start.
                crate::untrusted::read_host_file(path).map_err(|source| ConfigError::CaFile {
                    path: path.display().to_string(),
                    source,
                })?;
                Some(path.clone())
            }
            None => default("ca.crt"),
        };
        Ok(Some(KubernetesConfig {
            api_server,
            token_file: self
                .kubernetes_token_file
                .clone()
                .or_else(|| default("token")),
            ca_file,
            node: node.to_owned(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(api_server: Option<&str>) -> KubernetesArgs {
        KubernetesArgs {
            kubernetes_api_server: api_server.map(str::to_owned),
            kubernetes_token_file: None,
            kubernetes_ca_file: None,
        }
    }

    #[test]
    fn the_api_server_comes_from_the_flag_or_the_pod_environment() {
        let none = |_: &str| None;
        assert!(args(None).config_from("n", none).expect("ok").is_none());
        let in_pod = |name: &str| match name {
            "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".to_owned()),
            "KUBERNETES_SERVICE_PORT" => Some("6443".to_owned()),
            _ => None,
        };
        let config = args(None)
            .config_from("node-a", in_pod)
            .expect("ok")
            .expect("in a pod");
        assert_eq!(config.api_server, "https://10.96.0.1:6443");
        assert_eq!(config.node, "node-a");
        let ipv6 = |name: &str| (name == "KUBERNETES_SERVICE_HOST").then(|| "fd00::1".to_owned());
        let config = args(None).config_from("n", ipv6).expect("ok").expect("set");
        assert_eq!(config.api_server, "https://[fd00::1]:443");
        let config = args(Some("http://127.0.0.1:8001"))
            .config_from("n", none)
            .expect("ok")
            .expect("flag");
        assert_eq!(config.api_server, "http://127.0.0.1:8001");
        let missing_ca = KubernetesArgs {
            kubernetes_ca_file: Some("/nonexistent/ca.crt".into()),
            ..args(Some("https://k8s:443"))
        };
        assert!(matches!(
            missing_ca.config_from("n", none),
            Err(ConfigError::CaFile { .. })
        ));
    }
}
