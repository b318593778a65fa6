//! The glob patterns of `cooling.sensors[].match` and `network.rdma.devicePattern`.

/// True when `text` matches `pattern` as a whole: `*` matches any run of characters (also none),
/// `?` exactly one character, anything else itself (case-sensitive). There is no escaping and
/// no character class, as the policy documents.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    // Sensor and device names are ASCII: match bytes without collecting anything. Otherwise a
    // byte is not a character (`?` must match one character), so compare characters.
    if pattern.is_ascii() && text.is_ascii() {
        return glob(pattern.as_bytes(), text.as_bytes(), b'*', b'?');
    }
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    glob(&p, &t, '*', '?')
}

fn glob<T: Copy + PartialEq>(p: &[T], t: &[T], any_run: T, any_one: T) -> bool {
    let (mut pi, mut ti) = (0, 0);
    // Where the last `*` was, and the text position it is currently assumed to extend to.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some(&c) if c == any_run => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == any_one || t.get(ti) == Some(&c) => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                // Let the last `*` swallow one more character and retry from there.
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p.get(pi..).is_some_and(|rest| rest.iter().all(|c| *c == any_run))
}

#[cfg(test)]
mod tests {
    use super::glob_match;
    use proptest::prelude::*;

    #[test]
    fn star_matches_any_run_including_none() {
        assert!(glob_match("mlx5_*", "mlx5_0"));
        assert!(glob_match("mlx5_*", "mlx5_"));
        assert!(glob_match("mlx5_*", "mlx5_bond_0"));
        assert!(!glob_match("mlx5_*", "irdma0"));
        assert!(!glob_match("mlx5_*", "xmlx5_0"));
        assert!(glob_match("*", ""));
        assert!(glob_match("*/Inlet*", "ipmi/Inlet Temp"));
        assert!(!glob_match("*/Inlet*", "ipmi/Exhaust Temp"));
        assert!(glob_match("nvme*/*", "nvme0/Composite"));
        assert!(glob_match("a*b*c", "aXbYbZc"));
        assert!(!glob_match("a*b*c", "aXbYbZ"));
    }

    #[test]
    fn question_mark_matches_exactly_one_character() {
        assert!(glob_match("mlx5_?", "mlx5_7"));
        assert!(!glob_match("mlx5_?", "mlx5_10"));
        assert!(!glob_match("mlx5_?", "mlx5_"));
        assert!(glob_match("acpitz/temp?", "acpitz/temp1"));
    }

    #[test]
    fn other_characters_match_themselves_case_sensitively() {
        assert!(glob_match("acpitz/temp1", "acpitz/temp1"));
        assert!(!glob_match("acpitz/temp1", "acpitz/temp10"));
        assert!(!glob_match("MLX5_*", "mlx5_0"));
        assert!(glob_match("é*", "été"));
        assert!(!glob_match("", "x"));
        assert!(glob_match("", ""));
    }

    proptest! {
        #[test]
        fn a_text_matches_itself_and_star(text in ".{0,16}") {
            // `*` and `?` in the text would be wildcards; a text without them matches itself.
            let literal: String = text.chars().filter(|c| *c != '*' && *c != '?').collect();
            prop_assert!(glob_match(&literal, &literal));
            prop_assert!(glob_match("*", &text));
            let (pattern, prefixed) = (format!("*{literal}"), format!("x{literal}"));
            prop_assert!(glob_match(&pattern, &prefixed));
        }

        #[test]
        fn bytes_and_characters_agree_on_ascii(pattern in "[a*?/_]{0,12}", text in "[a/_]{0,12}") {
            let p: Vec<char> = pattern.chars().collect();
            let t: Vec<char> = text.chars().collect();
            prop_assert_eq!(
                super::glob(pattern.as_bytes(), text.as_bytes(), b'*', b'?'),
                super::glob(&p, &t, '*', '?')
            );
        }

        #[test]
        fn never_panics(pattern in "[a*?/_]{0,12}", text in "[a/_]{0,12}") {
            let _ = glob_match(&pattern, &text);
        }
    }
}
