//! Secrets at egress: the tool holds a placeholder; the proxy writes the value into the
//! request headers it forwards to the secret's hosts, and nowhere else.

use std::fmt;

/// A secret bound to hosts, as the proxy holds it for one run.
#[derive(Clone)]
pub struct BoundSecret {
    /// The variable the tool sees (for logs: never the value).
    pub env: String,
    /// What the tool holds: `strata-secret-` and 32 random hex digits, fresh per run.
    pub placeholder: String,
    value: String,
    hosts: Vec<String>,
}

impl fmt::Debug for BoundSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundSecret")
            .field("env", &self.env)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

impl BoundSecret {
    /// Binds `value` to `hosts` (exact names or `*.domain`, already validated by the caps)
    /// behind a fresh placeholder.
    pub fn new(env: &str, value: &str, hosts: &[String]) -> std::io::Result<BoundSecret> {
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(|e| std::io::Error::other(e.to_string()))?;
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        Ok(BoundSecret {
            env: env.to_string(),
            placeholder: format!("strata-secret-{hex}"),
            value: value.to_string(),
            hosts: hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
        })
    }

    /// The hosts (lowercase), as bound.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// Whether the value may be sent to `host` (a name as the client asked for it).
    pub fn bound_to(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        self.hosts
            .iter()
            .any(|pattern| match pattern.strip_prefix("*.") {
                Some(suffix) => host
                    .strip_suffix(suffix)
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
                None => *pattern == host,
            })
    }
}

/// Replaces the placeholders of the secrets bound to `host` in header values; returns the
/// variables whose values were written. Header names, the request line and bodies are
/// never changed.
pub fn substitute(
    headers: &mut [(String, String)],
    secrets: &[BoundSecret],
    host: &str,
) -> Vec<String> {
    let mut used = Vec::new();
    for secret in secrets.iter().filter(|s| s.bound_to(host)) {
        for (_, value) in headers.iter_mut() {
            if value.contains(&secret.placeholder) {
                *value = value.replace(&secret.placeholder, &secret.value);
                if !used.contains(&secret.env) {
                    used.push(secret.env.clone());
                }
            }
        }
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(hosts: &[&str]) -> BoundSecret {
        let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        BoundSecret::new("TOKEN", "s3cr3t", &hosts).expect("secret")
    }

    #[test]
    fn wildcards_bind_names_below_the_domain_only() {
        let s = secret(&["api.example.com", "*.github.com"]);
        assert!(s.bound_to("API.example.com"));
        assert!(s.bound_to("api.github.com"));
        assert!(s.bound_to("a.b.github.com"));
        assert!(!s.bound_to("github.com"));
        assert!(!s.bound_to("evilgithub.com"));
        assert!(!s.bound_to("api.example.com.evil"));
        assert!(!s.bound_to("example.com"));
    }

    #[test]
    fn only_bound_hosts_get_the_value_and_only_in_header_values() {
        let s = secret(&["api.example.com"]);
        let placeholder = s.placeholder.clone();
        let headers = vec![
            ("authorization".to_string(), format!("Bearer {placeholder}")),
            (placeholder.clone(), "name stays".to_string()),
        ];
        let mut to_bound = headers.clone();
        let used = substitute(&mut to_bound, std::slice::from_ref(&s), "api.example.com");
        assert_eq!(used, ["TOKEN"]);
        assert_eq!(to_bound[0].1, "Bearer s3cr3t");
        assert_eq!(to_bound[1].0, placeholder, "header names are not rewritten");
        let mut to_other = headers.clone();
        assert!(substitute(&mut to_other, &[s], "evil.example").is_empty());
        assert_eq!(to_other, headers);
    }

    #[test]
    fn placeholders_are_fresh_and_debug_never_shows_the_value() {
        let (a, b) = (secret(&["x.example"]), secret(&["x.example"]));
        assert_ne!(a.placeholder, b.placeholder);
        assert!(!format!("{a:?}").contains("s3cr3t"));
    }
}
