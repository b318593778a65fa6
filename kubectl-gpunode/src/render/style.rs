//! Colour: only when stdout is a terminal, and never when `NO_COLOR` is set (no-color.org).

use std::io::IsTerminal;

/// Whether to colour, decided once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Style {
    color: bool,
}

/// What a piece of text means, hence its colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tone {
    /// Healthy: green.
    Good,
    /// Waiting or unknown: yellow.
    Warn,
    /// Drifted, broken, needs a person: red.
    Bad,
    /// A heading: bold.
    Strong,
}

impl Style {
    /// Colour when stdout is a terminal and `NO_COLOR` is unset or empty.
    pub fn detect() -> Style {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Style {
            color: !no_color && std::io::stdout().is_terminal(),
        }
    }

    /// No colour (tests).
    #[cfg(test)]
    pub fn plain() -> Style {
        Style { color: false }
    }

    /// Always colour (tests of the colouring).
    #[cfg(test)]
    pub fn colored() -> Style {
        Style { color: true }
    }

    /// `text` in `tone`'s colour, or as is.
    pub fn paint(self, tone: Tone, text: &str) -> String {
        if !self.color || text.is_empty() {
            return text.to_string();
        }
        let code = match tone {
            Tone::Good => "32",
            Tone::Warn => "33",
            Tone::Bad => "31",
            Tone::Strong => "1",
        };
        format!("\x1b[{code}m{text}\x1b[0m")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_has_no_escape_codes() {
        assert_eq!(Style::plain().paint(Tone::Bad, "drifted"), "drifted");
        assert_eq!(
            Style::colored().paint(Tone::Bad, "drifted"),
            "\x1b[31mdrifted\x1b[0m"
        );
        assert_eq!(Style::colored().paint(Tone::Bad, ""), "");
    }
}
