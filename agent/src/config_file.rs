//! Reading the config file (`--config-path`) through the safe path;
//! `agent_config::file` parses it.

use std::path::Path;

pub use agent_config::file::{ConfigFile, ConfigFileError, RELABEL_CONFIGS, Setting, SettingValue};

pub fn load(path: &Path) -> Result<ConfigFile, ConfigFileError> {
    let text = crate::untrusted::read_host_text(path).map_err(|source| ConfigFileError::Read {
        path: path.to_path_buf(),
        source: source.into(),
    })?;
    ConfigFile::parse(&text, path)
}
