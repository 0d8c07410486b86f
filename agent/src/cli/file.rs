//! Flags from the config file (`--config-path`), applied under the command
//! line: each key becomes its flag's default, so a flag given on the
//! command line or through its environment variable wins over the file,
//! and the file wins over the built-in default. The file's values are
//! checked by clap's own parsers (on their own, so a bad value is named
//! with its line even when the command line overrides it).

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

use clap::{
    Arg, ArgAction, ArgMatches, Command, CommandFactory, FromArgMatches,
    builder::Resettable,
    error::{ContextKind, ContextValue, ErrorKind},
    parser::ValueSource,
};

use super::{Cli, Command as Subcommand};
use crate::config_file::{ConfigFileError, RELABEL_CONFIGS, Setting, SettingValue};

/// Why the command line and config file do not make a [`Cli`].
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// A bad flag, or `--help`/`--version`: clap prints it and exits.
    #[error(transparent)]
    Clap(#[from] clap::Error),
    #[error(transparent)]
    ConfigFile(#[from] ConfigFileError),
}

/// One setting of the file, matched to its flag.
struct Applied<'a> {
    setting: &'a Setting,
    id: String,
    long: String,
    switch: bool,
    values: Vec<String>,
}

/// Parses the command line and, with `--config-path`, the config file
/// beneath it.
pub fn parse_args<I, T>(args: I) -> Result<Cli, ArgsError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let command = Cli::command();
    let matches = command.clone().try_get_matches_from(&args)?;
    let (subcommand, path) = match matches.subcommand() {
        Some((name, sub)) => (Some(name.to_owned()), config_path(sub)),
        None => (None, config_path(&matches)),
    };
    let Some(path) = path else {
        return Ok(Cli::from_arg_matches(&matches)?);
    };
    let file = crate::config_file::load(&path)?;
    let target = match &subcommand {
        Some(name) => command
            .find_subcommand(name)
            .cloned()
            .unwrap_or_else(|| command.clone()),
        None => command.clone(),
    };
    let applied = file
        .settings
        .iter()
        .map(|setting| applied(&command, &target, subcommand.as_deref(), setting, &path))
        .collect::<Result<Vec<_>, _>>()?;
    check_alone(&command, subcommand.as_deref(), &applied, &path)?;

    let mut command = command;
    for one in &applied {
        let values = one.values.clone();
        let set = move |arg: Arg| arg.default_values(values);
        command = match (&subcommand, is_root_arg(&target, &one.id)) {
            (Some(name), false) => command.mut_subcommand(name, |sub| sub.mut_arg(&one.id, set)),
            _ => command.mut_arg(&one.id, set),
        };
    }
    let matches = command.clone().try_get_matches_from(&args)?;
    let leaf = match &subcommand {
        Some(name) => matches.subcommand_matches(name).unwrap_or(&matches),
        None => &matches,
    };
    command.build();
    let leaf_command = match &subcommand {
        Some(name) => command.find_subcommand(name).unwrap_or(&command),
        None => &command,
    };
    check_conflicts(leaf_command, leaf, &applied, &path)?;
    let relabel_rules = file.relabel_rules(&path)?;
    let destinations = file
        .destinations
        .iter()
        .enumerate()
        .map(|(index, entry)| super::destinations::DestinationArgs::from_entry(entry, &path, index))
        .collect::<Result<Vec<_>, _>>()?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    match &mut cli.command {
        Some(Subcommand::Record(args)) => {
            if !destinations.is_empty() {
                return Err(ConfigFileError::Destination {
                    path: path.clone(),
                    index: 0,
                    reason: "`firn record` writes a file; destinations are the agent's".into(),
                }
                .into());
            }
            args.relabel_rules = relabel_rules;
        }
        Some(Subcommand::Report(_) | Subcommand::Top(_)) => {}
        None => {
            cli.agent.relabel_rules = relabel_rules;
            cli.agent.destinations = destinations;
        }
    }
    Ok(cli)
}

fn config_path(matches: &ArgMatches) -> Option<PathBuf> {
    matches
        .try_get_one::<PathBuf>("config_path")
        .ok()
        .flatten()
        .cloned()
}

/// Whether `id` is defined on the root command rather than `target`.
fn is_root_arg(target: &Command, id: &str) -> bool {
    !target.get_arguments().any(|arg| arg.get_id() == id)
}

/// The flag `key` names, and the file's value as that flag's values.
fn applied<'a>(
    root: &Command,
    target: &Command,
    subcommand: Option<&str>,
    setting: &'a Setting,
    path: &Path,
) -> Result<Applied<'a>, ConfigFileError> {
    let key = setting.key.as_str();
    let settable = |arg: &&Arg| {
        !matches!(arg.get_id().as_str(), "help" | "version" | "config_path")
            && arg.get_long().is_some()
    };
    let names = |arg: &Arg| {
        let mut names: Vec<String> = arg.get_long().map(str::to_owned).into_iter().collect();
        names.extend(
            arg.get_all_aliases()
                .unwrap_or_default()
                .into_iter()
                .map(str::to_owned),
        );
        names
    };
    let candidates: Vec<&Arg> = match subcommand {
        Some(_) => target
            .get_arguments()
            .chain(root.get_arguments().filter(|arg| arg.is_global_set()))
            .filter(settable)
            .collect(),
        None => root.get_arguments().filter(settable).collect(),
    };
    let Some(arg) = candidates
        .iter()
        .find(|arg| names(arg).iter().any(|name| name == key))
    else {
        let error = |hint: String| ConfigFileError::UnknownKey {
            path: path.to_path_buf(),
            line: setting.line,
            key: key.to_owned(),
            hint,
            command: if subcommand.is_some() { " record" } else { "" },
        };
        if key == "config-path" {
            return Err(ConfigFileError::Value {
                path: path.to_path_buf(),
                line: setting.line,
                key: key.to_owned(),
                problem: "cannot be set in the config file itself".into(),
            });
        }
        let kebab = key.trim_start_matches('-').replace('_', "-");
        let hint = if kebab == "relabel-configs" {
            format!(": did you mean `{RELABEL_CONFIGS}`?")
        } else if kebab != key && candidates.iter().any(|arg| names(arg).contains(&kebab)) {
            format!(": did you mean `{kebab}`?")
        } else {
            String::new()
        };
        return Err(error(hint));
    };
    let long = arg.get_long().unwrap_or(key).to_owned();
    let problem = |problem: &str| ConfigFileError::Value {
        path: path.to_path_buf(),
        line: setting.line,
        key: key.to_owned(),
        problem: problem.to_owned(),
    };
    let switch = matches!(arg.get_action(), ArgAction::SetTrue);
    let many = matches!(arg.get_action(), ArgAction::Append);
    let values = match (&setting.value, switch, many) {
        (SettingValue::Bool(on), true, _) => vec![on.to_string()],
        (_, true, _) => return Err(problem("is a switch: true or false")),
        (SettingValue::Bool(on), false, _) => vec![on.to_string()],
        (SettingValue::One(value), false, _) => vec![value.clone()],
        (SettingValue::Many(values), false, true) => values.clone(),
        (SettingValue::Many(_), false, false) => {
            return Err(problem("takes one value, not a list or a map"));
        }
    };
    Ok(Applied {
        setting,
        id: arg.get_id().as_str().to_owned(),
        long,
        switch,
        values,
    })
}

/// Parses the file's flags by themselves (no environment), so clap's
/// parsers and conflicts judge them and an error points into the file.
fn check_alone(
    command: &Command,
    subcommand: Option<&str>,
    applied: &[Applied<'_>],
    path: &Path,
) -> Result<(), ConfigFileError> {
    let mut argv: Vec<String> = vec!["firn".into()];
    argv.extend(subcommand.map(str::to_owned));
    for one in applied {
        if one.switch {
            if one.values.iter().any(|value| value == "true") {
                argv.push(format!("--{}", one.long));
            }
        } else {
            argv.extend(
                one.values
                    .iter()
                    .map(|value| format!("--{}={value}", one.long)),
            );
        }
    }
    let no_env = |arg: Arg| arg.env(Resettable::Reset);
    let alone = command
        .clone()
        .mut_args(no_env)
        .mut_subcommands(|sub| sub.mut_args(no_env));
    let Err(error) = alone.try_get_matches_from(&argv) else {
        return Ok(());
    };
    Err(file_error(&error, applied, path))
}

/// A clap error about the file's flags, told as the file's.
fn file_error(error: &clap::Error, applied: &[Applied<'_>], path: &Path) -> ConfigFileError {
    let flag = |kind: ContextKind| match error.get(kind) {
        Some(ContextValue::String(text)) => text
            .trim_start_matches('-')
            .split([' ', '='])
            .next()
            .map(str::to_owned),
        _ => None,
    };
    let setting = |long: &str| applied.iter().find(|one| one.long == long);
    let Some(one) = flag(ContextKind::InvalidArg).and_then(|long| setting(&long)) else {
        return ConfigFileError::Parse {
            path: path.to_path_buf(),
            reason: first_line(error),
        };
    };
    let line = one.setting.line;
    let key = one.setting.key.clone();
    match error.kind() {
        ErrorKind::ArgumentConflict => ConfigFileError::Conflict {
            path: path.to_path_buf(),
            line,
            key,
            other: flag(ContextKind::PriorArg).unwrap_or_default(),
        },
        ErrorKind::ValueValidation | ErrorKind::InvalidValue => {
            let value = match error.get(ContextKind::InvalidValue) {
                Some(ContextValue::String(value)) => value.clone(),
                _ => one.values.join(", "),
            };
            let reason = match (
                std::error::Error::source(error),
                error.get(ContextKind::ValidValue),
            ) {
                (Some(source), _) => source.to_string(),
                (None, Some(ContextValue::Strings(valid))) => {
                    format!("expected one of {}", valid.join(", "))
                }
                _ => first_line(error),
            };
            ConfigFileError::InvalidValue {
                path: path.to_path_buf(),
                line,
                key,
                value,
                reason,
            }
        }
        _ => ConfigFileError::Value {
            path: path.to_path_buf(),
            line,
            key,
            problem: first_line(error),
        },
    }
}

fn first_line(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let line = rendered.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_owned()
}

/// Clap does not check defaults against conflicts: a file's flag in effect
/// must not conflict with one given on the command line or environment.
fn check_conflicts(
    command: &Command,
    matches: &ArgMatches,
    applied: &[Applied<'_>],
    path: &Path,
) -> Result<(), ConfigFileError> {
    let explicit = |id: &str| {
        let given = matches!(
            matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        // A switch is only there when on.
        given && (!is_switch(command, id) || matches.get_flag(id))
    };
    for one in applied {
        let in_effect = matches.value_source(&one.id) == Some(ValueSource::DefaultValue)
            && !(one.switch && one.values.iter().all(|value| value == "false"));
        if !in_effect {
            continue;
        }
        let Some(arg) = command
            .get_arguments()
            .find(|arg| arg.get_id() == one.id.as_str())
        else {
            continue;
        };
        for other in command.get_arguments() {
            let conflicting = command
                .get_arg_conflicts_with(arg)
                .iter()
                .any(|a| a.get_id() == other.get_id())
                || command
                    .get_arg_conflicts_with(other)
                    .iter()
                    .any(|a| a.get_id() == arg.get_id());
            if conflicting && explicit(other.get_id().as_str()) {
                return Err(ConfigFileError::Conflict {
                    path: path.to_path_buf(),
                    line: one.setting.line,
                    key: one.setting.key.clone(),
                    other: other.get_long().unwrap_or_default().to_owned(),
                });
            }
        }
    }
    Ok(())
}

fn is_switch(command: &Command, id: &str) -> bool {
    command
        .get_arguments()
        .find(|arg| arg.get_id() == id)
        .is_some_and(|arg| matches!(arg.get_action(), ArgAction::SetTrue))
}

#[cfg(test)]
mod tests;
