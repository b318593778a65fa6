//! Text output: tables, colour, timestamps; and the same data as JSON or YAML.

pub mod style;
pub mod table;

use jiff::{Timestamp, Unit};
use serde::Serialize;

use crate::{cli::Format, error::Error};

/// A timestamp to the second (`2026-11-29T12:00:00Z`): always 20 characters, so tables line up
/// and tests can mask it.
pub fn time(t: Timestamp) -> String {
    t.round(Unit::Second)
        .unwrap_or(t)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// `-` for an empty list, else its items joined by `sep`.
pub fn list(items: &[String], sep: &str) -> String {
    if items.is_empty() {
        "-".to_string()
    } else {
        items.join(sep)
    }
}

/// `data` as JSON or YAML (with a final newline), or `text` for [`Format::Text`].
pub fn output<T: Serialize>(
    format: Format,
    data: &T,
    text: impl FnOnce(&T) -> String,
) -> Result<String, Error> {
    match format {
        Format::Text => Ok(text(data)),
        Format::Json => serde_json::to_string_pretty(data)
            .map(|s| s + "\n")
            .map_err(|e| Error::Output(e.to_string())),
        Format::Yaml => serde_yaml::to_string(data).map_err(|e| Error::Output(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_to_the_second() {
        let t: Timestamp = "2026-11-29T12:00:00.6Z".parse().unwrap_or_default();
        assert_eq!(time(t), "2026-11-29T12:00:01Z");
    }
}
