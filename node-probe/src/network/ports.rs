//! RDMA ports in sysfs (`class/infiniband/<dev>/ports/<n>/`): state, physical state, rate, RoCE
//! v2 GIDs and the network interface behind the port.
//!
//! It only reads sysfs; it never writes to it.

use std::path::Path;

use crate::sysfs::{self, SysfsError};

/// `state`: "4: ACTIVE" → "Active".
pub fn parse_state(path: &Path, text: &str) -> Result<String, SysfsError> {
    let (code, _) = split_code(path, text)?;
    let name = match code {
        1 => "Down",
        2 => "Init",
        3 => "Armed",
        4 => "Active",
        5 => "ActiveDefer",
        other => {
            return Err(SysfsError::parse(
                path,
                text,
                format!("unknown port state {other}"),
            ));
        }
    };
    Ok(name.to_owned())
}

/// `phys_state`: "5: LinkUp" → "LinkUp".
pub fn parse_phys_state(path: &Path, text: &str) -> Result<String, SysfsError> {
    let (_, name) = split_code(path, text)?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == ' ' || c == '_')
    {
        return Err(SysfsError::parse(path, text, "expected \"<n>: <name>\""));
    }
    Ok(name.replace(' ', ""))
}

fn split_code<'t>(path: &Path, text: &'t str) -> Result<(u32, &'t str), SysfsError> {
    let (code, name) = text
        .split_once(':')
        .ok_or_else(|| SysfsError::parse(path, text, "expected \"<n>: <name>\""))?;
    let code = code
        .trim()
        .parse()
        .map_err(|e| SysfsError::parse(path, text, e))?;
    Ok((code, name.trim()))
}

/// `rate`: "400 Gb/sec (4X NDR)" → 400; fractional rates round down ("2.5 Gb/sec" → 2).
pub fn parse_rate(path: &Path, text: &str) -> Result<u32, SysfsError> {
    let number = text.split_whitespace().next().unwrap_or("");
    if !text.contains("Gb/sec") {
        return Err(SysfsError::parse(path, text, "expected \"<n> Gb/sec ...\""));
    }
    let gbps: f64 = number.parse().map_err(|e| SysfsError::parse(path, text, e))?;
    if !(0.0..=100_000.0).contains(&gbps) {
        return Err(SysfsError::parse(path, text, "implausible rate"));
    }
    Ok(gbps as u32)
}

/// GID indexes whose type is "RoCE v2". Unpopulated or unreadable indexes (EINVAL on a real
/// node) count as empty. None when the port has no `gid_attrs/types` directory.
pub fn roce_v2_indexes(port: &Path) -> Result<Option<Vec<u32>>, SysfsError> {
    let dir = port.join("gid_attrs/types");
    if !dir.is_dir() {
        return Ok(None);
    }
    let mut found = Vec::new();
    for name in sysfs::dir_names(&dir)? {
        let Ok(index) = name.parse::<u32>() else { continue };
        if sysfs::read_text(&dir.join(&name)).is_ok_and(|t| t == "RoCE v2") {
            found.push(index);
        }
    }
    found.sort_unstable();
    Ok(Some(found))
}

/// The network interface behind a port: the `gid_attrs/ndevs` entry of a RoCE v2 GID (covers
/// bonds), else of any GID, else the first interface of the RDMA device's PCI function.
pub fn netdev(device: &Path, port: &Path, v2: &[u32]) -> Option<String> {
    let ndevs = port.join("gid_attrs/ndevs");
    let from_index = |i: &u32| {
        sysfs::read_text(&ndevs.join(i.to_string()))
            .ok()
            .filter(|n| valid_ifname(n))
    };
    if let Some(name) = v2.iter().find_map(from_index) {
        return Some(name);
    }
    let any: Vec<u32> = sysfs::dir_names(&ndevs)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    if let Some(name) = any.iter().find_map(from_index) {
        return Some(name);
    }
    sysfs::dir_names(&device.join("device/net"))
        .unwrap_or_default()
        .into_iter()
        .find(|n| valid_ifname(n))
}

/// Linux interface names: 1–15 bytes, no '/', whitespace or NUL.
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && !name.contains(['/', '\0'])
        && !name.chars().any(char::is_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("f")
    }

    #[test]
    fn parses_port_files() {
        assert_eq!(parse_state(p(), "4: ACTIVE").ok().as_deref(), Some("Active"));
        assert_eq!(parse_state(p(), "1: DOWN").ok().as_deref(), Some("Down"));
        assert!(parse_state(p(), "9: WHAT").is_err());
        assert!(parse_state(p(), "ACTIVE").is_err());
        assert_eq!(parse_phys_state(p(), "5: LinkUp").ok().as_deref(), Some("LinkUp"));
        assert_eq!(
            parse_phys_state(p(), "3: Disabled").ok().as_deref(),
            Some("Disabled")
        );
        assert!(parse_phys_state(p(), "5:").is_err());
        assert_eq!(parse_rate(p(), "400 Gb/sec (4X NDR)").ok(), Some(400));
        assert_eq!(parse_rate(p(), "2.5 Gb/sec (1X SDR)").ok(), Some(2));
        assert!(parse_rate(p(), "fast").is_err());
        assert!(parse_rate(p(), "-5 Gb/sec").is_err());
        assert!(parse_rate(p(), "1e99 Gb/sec").is_err());
    }

    #[test]
    fn checks_interface_names() {
        assert!(valid_ifname("ens1f0np0"));
        assert!(valid_ifname("mlx5_bond_0"));
        assert!(!valid_ifname(""));
        assert!(!valid_ifname("a/b"));
        assert!(!valid_ifname("sixteen-chars-xx"));
    }
}
