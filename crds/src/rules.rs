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

/// The probe publishes a heartbeat at least once a minute; a report is never stale sooner.
pub const MIN_STALE_AFTER: &str = "60s";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_pattern_is_built_from_the_clause() {
        let expected = format!("^{CLAUSE}(,{CLAUSE})*$");
        assert_eq!(VERSION_RANGE_RE, expected);
    }
}
