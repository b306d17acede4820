//! The names the hub's listener answers to. A page on another site can make a browser send
//! requests to 127.0.0.1 under its own name (DNS rebinding: `evil.example` resolving to
//! 127.0.0.1), and such a request carries that name in its `Host` header. So every request
//! whose Host is not one of the hub's names is refused with 421 before any route sees it:
//! loopback addresses (the listen address is one), `localhost`, the host of the mesh's
//! public URL, and what settings.json `allowedHosts` (or `CORTEX_ALLOWED_HOSTS`) adds.
//! A request without a Host header (HTTP/1.0, a raw client) is no browser's and passes.
//! The rule is here; `server::hosts::check` applies it to every route.

use std::net::IpAddr;

/// The names besides loopback and `localhost`, lowercased, without a trailing dot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hosts {
    names: Vec<String>,
}

impl Hosts {
    pub fn new(names: impl IntoIterator<Item = String>) -> Hosts {
        let mut v: Vec<String> = names
            .into_iter()
            .map(|n| normal(&n))
            .filter(|n| !n.is_empty() && !Hosts::default().allows(n))
            .collect();
        v.sort();
        v.dedup();
        Hosts { names: v }
    }

    /// Whether a request with this `Host` value is for this hub.
    pub fn allows(&self, host: &str) -> bool {
        let Some(name) = name_of(host) else {
            return false;
        };
        let name = normal(name);
        if name == "localhost" {
            return true;
        }
        if let Ok(ip) = name.parse::<IpAddr>() {
            return is_loopback(ip) || self.names.contains(&name);
        }
        self.names.contains(&name)
    }

    /// The names, as a refusal lists them.
    pub fn describe(&self) -> String {
        let mut all = vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
            "[::1]".to_string(),
        ];
        all.extend(self.names.iter().cloned());
        all.join(", ")
    }
}

fn normal(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// The name in a `Host` value: `[::1]:3001` is `::1`, `hub:3001` is `hub`; `None` for a
/// value that is not a host (empty, a bracket left open, a bad port).
pub fn name_of(host: &str) -> Option<&str> {
    let host = host.trim();
    if let Some(rest) = host.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        return match after {
            "" => Some(ip),
            p if p
                .strip_prefix(':')
                .is_some_and(|p| p.parse::<u16>().is_ok()) =>
            {
                Some(ip)
            }
            _ => None,
        };
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.parse::<u16>().is_ok() && !name.contains(':') => name,
        Some(_) => return None,
        None => host,
    };
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hubs_names_pass_and_others_do_not() {
        let hosts =
            Hosts::new(["Hub.Example.", "10.0.0.5", "127.0.0.1", "localhost"].map(String::from));
        assert_eq!(
            hosts.describe(),
            "127.0.0.1, localhost, [::1], 10.0.0.5, hub.example"
        );
        for (host, ok) in [
            ("127.0.0.1:3001", true),
            ("127.0.0.1", true),
            ("127.8.9.10:80", true),
            ("localhost:3001", true),
            ("LOCALHOST", true),
            ("[::1]:3001", true),
            ("[::1]", true),
            ("hub.example:443", true),
            ("hub.example.", true),
            ("10.0.0.5:3001", true),
            ("evil.example:3001", false),
            ("evil.example", false),
            ("localhost.evil.example", false),
            ("10.0.0.6:3001", false),
            ("[::2]:3001", false),
            ("", false),
            ("[::1", false),
            ("hub.example:notaport", false),
            ("::1", false),
        ] {
            assert_eq!(hosts.allows(host), ok, "{host:?}");
        }
        assert!(!Hosts::default().allows("hub.example"));
        assert_eq!(Hosts::default().describe(), "127.0.0.1, localhost, [::1]");
    }
}
