//! Validation rules shared by the generated schema (CEL `x-kubernetes-validations`, evaluated by
//! the API server) and the Rust parsers, so both accept exactly the same strings.

/// One clause of a version range: an optional operator, then 1-4 dotted numeric components.
/// `[.]` instead of `\.` keeps the pattern free of CEL string escapes.
#[cfg(test)]
const CLAUSE: &str = "[ ]*(>=|<=|==|!=|~=|>|<|=)?[ ]*[0-9]{1,9}([.][0-9]{1,9}){0,3}[ ]*";

/// A whole version range: clauses separated by commas (`^CLAUSE(,CLAUSE)*$`, checked by a test).
pub const VERSION_RANGE_RE: &str = "^[ ]*(>=|<=|==|!=|~=|>|<|=)?[ ]*[0-9]{1,9}([.][0-9]{1,9}){0,3}[ ]*\
(,[ ]*(>=|<=|==|!=|~=|>|<|=)?[ ]*[0-9]{1,9}([.][0-9]{1,9}){0,3}[ ]*)*$";

/// What a user is told when a version range is malformed.
pub const VERSION_RANGE_HINT: &str = "comma-separated clauses that must all hold, each an optional \
operator (>=, >, <=, <, ==, != or ~=) and a dotted version, for example \">=550.54.15, <560\", \
\"12.4\" or \"~=535\"";

/// A Kubernetes-style duration with no sign: `0`, `30s`, `5m`, `1h30m`, `1.5h`, `250ms`.
pub const DURATION_RE: &str = "^(0|([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+)$";

/// What a user is told when a duration is malformed or negative.
pub const DURATION_HINT: &str = "must be a duration such as \"30s\", \"5m\" or \"1h30m\" \
(units ns, us, ms, s, m, h); negative durations are not allowed";

/// `maxUnavailable` printed as a string: a count (an integer, or digits in a string) or a
/// percentage from 0% to 100%. A negative integer prints with a sign and fails.
pub const MAX_UNAVAILABLE_RE: &str = "^([0-9]{1,9}|(100|[1-9]?[0-9])%)$";

/// What a user is told when `maxUnavailable` is out of range.
pub const MAX_UNAVAILABLE_HINT: &str = "must be a number of nodes (0 or more) or a percentage \
from 0% to 100%, such as 1 or \"10%\"";

/// A glob (`*`, `?`) with no regular-expression syntax, which as a glob would silently match
/// nothing: `.` followed by `*`, `+` or `?`, or any of `^ $ ( ) | [ ] { } + \`. `{field}` is
/// replaced by the CEL path of the pattern.
pub const GLOB_NOT_REGEX_RULE: &str = "!{field}.matches('[.][*+?]') && \
!['^', '$', '(', ')', '|', '[', ']', '{', '}', '+', '\\\\'].exists(c, {field}.contains(c))";

/// What a user is told when a glob looks like a regular expression.
pub const GLOB_NOT_REGEX_HINT: &str = "devicePattern is a glob, not a regular expression: '*' matches \
any run of characters and '?' any one character, so write \"mlx5_*\" rather than \"mlx5_.*\" or \"^mlx5\"";

/// Whether `pattern` uses regular-expression syntax that a glob would take literally (the same
/// test as [`GLOB_NOT_REGEX_RULE`]).
pub fn looks_like_regex(pattern: &str) -> bool {
    pattern.contains(".*")
        || pattern.contains(".+")
        || pattern.contains(".?")
        || pattern.contains(['^', '$', '(', ')', '|', '[', ']', '{', '}', '+', '\\'])
}

/// The probe publishes a heartbeat at least once a minute; a report is never stale sooner.
pub const MIN_STALE_AFTER: &str = "60s";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regex_syntax_is_told_from_globs() {
        for regex in [
            "mlx5_.*",
            "mlx5_.+",
            "^mlx5_0",
            "mlx5_0$",
            "(mlx5|bnxt)_0",
            "mlx5_[0-3]",
            "mlx5_\\d",
            "mlx5_0+",
        ] {
            assert!(looks_like_regex(regex), "{regex}");
        }
        for glob in ["mlx5_*", "mlx5_?", "*", "bnxt_re*", "rocep1s0f?", "irdma-x.1"] {
            assert!(!looks_like_regex(glob), "{glob}");
        }
    }

    #[test]
    fn version_pattern_is_built_from_the_clause() {
        let expected = format!("^{CLAUSE}(,{CLAUSE})*$");
        assert_eq!(VERSION_RANGE_RE, expected);
    }
}
