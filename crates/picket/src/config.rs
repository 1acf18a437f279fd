//! `picket serve --config FILE`: every flag of `picket serve` may be set in a TOML file, with
//! the precedence flag > `PICKET_*` environment variable > file > built-in default.
//!
//! The file's values become the default values of `serve`'s arguments before the command line
//! is parsed, so clap's own order (command line, then environment, then default) gives the
//! precedence above, and each value goes through the same parser as the flag: a bad value is
//! refused with the flag's own message. Keys are the flags' long names without dashes
//! (`data-dir`, or `data_dir`); a key that names no flag is refused with the list of keys.

use anyhow::{Context, bail};
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::PathBuf;

/// The environment variable that names the config file, like `--config`.
pub const CONFIG_ENV: &str = "PICKET_CONFIG";
/// Largest config file read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Flags that belong on the command line only.
const NOT_IN_FILE: [&str; 3] = ["config", "print_config", "help"];

/// The arguments of `serve` whose defaults came from the config file.
#[derive(Debug, Default)]
pub struct FromFile {
    path: Option<PathBuf>,
    ids: BTreeSet<String>,
}

/// The config file `picket serve` was given, on its command line or in [`CONFIG_ENV`].
fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let serve = args.iter().position(|arg| arg == "serve")?;
    // `picket kv serve` is the store, not the node.
    if serve > 0 && args[serve - 1] == "kv" {
        return None;
    }
    let mut rest = args[serve + 1..].iter();
    while let Some(arg) = rest.next() {
        let arg = arg.to_string_lossy();
        if arg == "--config" {
            return rest.next().map(PathBuf::from);
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            return Some(PathBuf::from(path));
        }
    }
    std::env::var_os(CONFIG_ENV).map(PathBuf::from)
}

/// `command` with the config file's values as the defaults of `serve`'s arguments.
///
/// # Errors
/// When the file cannot be read, is not TOML, or names a key that is no flag of `serve`.
pub fn apply(command: Command, args: &[OsString]) -> anyhow::Result<(Command, FromFile)> {
    let Some(path) = config_path(args) else { return Ok((command, FromFile::default())) };
    let size = std::fs::metadata(&path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?
        .len();
    if size > MAX_CONFIG_BYTES {
        bail!("the config file {} is over {MAX_CONFIG_BYTES} bytes", path.display());
    }
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    let table: toml::Table = toml::from_str(&text)
        .with_context(|| format!("the config file {} is not valid TOML", path.display()))?;
    let serve = command.find_subcommand("serve").expect("picket has a serve command").clone();
    let mut settings = Vec::new();
    for (key, value) in &table {
        let id = key.replace('-', "_");
        let arg = serve
            .get_arguments()
            .find(|arg| arg.get_id() == id.as_str() || arg.get_long() == Some(key.as_str()))
            .filter(|arg| !NOT_IN_FILE.contains(&arg.get_id().as_str()));
        let Some(arg) = arg else {
            bail!(
                "{}: {key:?} is not a setting of picket serve; the settings are: {}",
                path.display(),
                keys(&serve).join(", ")
            );
        };
        let values = strings(value).with_context(|| format!("{}: {key}", path.display()))?;
        settings.push((arg.get_id().to_string(), values));
    }
    let mut from_file = FromFile { path: Some(path), ids: BTreeSet::new() };
    let command = command.mut_subcommand("serve", |mut serve| {
        for (id, values) in settings {
            let is_flag = serve
                .get_arguments()
                .find(|arg| arg.get_id() == id.as_str())
                .is_some_and(|arg| matches!(arg.get_action(), ArgAction::SetTrue));
            // A flag set to false in the file is the flag's own default.
            if is_flag && values.iter().all(|value| value == "false") {
                continue;
            }
            from_file.ids.insert(id.clone());
            serve = serve.mut_arg(id, |arg| arg.default_values(values));
        }
        serve
    });
    Ok((command, from_file))
}

/// The keys a config file may hold: `serve`'s flags, as written in the file.
fn keys(serve: &Command) -> Vec<String> {
    serve
        .get_arguments()
        .filter(|arg| !NOT_IN_FILE.contains(&arg.get_id().as_str()) && !arg.is_hide_set())
        .filter_map(|arg| arg.get_long().map(str::to_owned))
        .collect()
}

/// A TOML value as the strings clap parses: a scalar, or an array of scalars.
fn strings(value: &toml::Value) -> anyhow::Result<Vec<String>> {
    match value {
        toml::Value::Array(items) => items.iter().map(scalar).collect(),
        other => Ok(vec![scalar(other)?]),
    }
}

fn scalar(value: &toml::Value) -> anyhow::Result<String> {
    match value {
        toml::Value::String(text) => Ok(text.clone()),
        toml::Value::Integer(number) => Ok(number.to_string()),
        toml::Value::Float(number) => Ok(number.to_string()),
        toml::Value::Boolean(flag) => Ok(flag.to_string()),
        _ => bail!("give a string, a number, a boolean, or an array of them"),
    }
}

/// The effective settings of `serve` as TOML, each with where it came from.
#[must_use]
pub fn render(serve: &Command, matches: &ArgMatches, from_file: &FromFile) -> String {
    let mut text =
        String::from("# picket serve: the settings in effect, and where each came from\n");
    if let Some(path) = &from_file.path {
        text.push_str(&format!("# config file: {}\n", path.display()));
    }
    for arg in serve.get_arguments() {
        let id = arg.get_id().as_str();
        if NOT_IN_FILE.contains(&id) || arg.is_hide_set() {
            continue;
        }
        let Some(long) = arg.get_long() else { continue };
        let source = match matches.value_source(id) {
            Some(ValueSource::CommandLine) => "flag",
            Some(ValueSource::EnvVariable) => "environment",
            Some(ValueSource::DefaultValue) if from_file.ids.contains(id) => "file",
            Some(ValueSource::DefaultValue) => "default",
            _ => {
                text.push_str(&format!("# {long} is not set\n"));
                continue;
            }
        };
        let values: Vec<String> = matches
            .get_raw(id)
            .into_iter()
            .flatten()
            .map(|value| toml_value(&value.to_string_lossy()))
            .collect();
        let value = match (values.len(), matches!(arg.get_action(), ArgAction::Append)) {
            (1, false) => values[0].clone(),
            _ => format!("[{}]", values.join(", ")),
        };
        text.push_str(&format!("{long} = {value}  # {source}\n"));
    }
    text
}

/// A raw value as TOML: numbers and booleans as they are, anything else a quoted string.
fn toml_value(raw: &str) -> String {
    if raw.parse::<i64>().is_ok() || raw == "true" || raw == "false" {
        raw.to_owned()
    } else {
        // A JSON string is a TOML basic string: the same quotes and escapes.
        serde_json::Value::String(raw.to_owned()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(items: &[&str]) -> Vec<OsString> {
        items.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_config_path_comes_from_serve_flags_only() {
        assert_eq!(
            config_path(&args(&["picket", "serve", "--config", "a.toml"])),
            Some(PathBuf::from("a.toml"))
        );
        assert_eq!(
            config_path(&args(&["picket", "serve", "--config=b.toml"])),
            Some(PathBuf::from("b.toml"))
        );
        assert_eq!(config_path(&args(&["picket", "kv", "serve", "--config", "c.toml"])), None);
    }

    #[test]
    fn values_become_strings_clap_parses() {
        assert_eq!(strings(&toml::Value::Integer(7)).expect("a number"), ["7"]);
        let array = toml::Value::Array(vec!["a/".into(), "b/".into()]);
        assert_eq!(strings(&array).expect("an array"), ["a/", "b/"]);
        assert!(strings(&toml::Value::Table(toml::Table::new())).is_err());
        assert_eq!(toml_value("7687"), "7687");
        assert_eq!(toml_value("./picket-data"), "\"./picket-data\"");
    }
}
