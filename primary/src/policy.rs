//! The destination policy of this process: the rules of [`zlink_wire::destination`] with the
//! service's own short domains and the operator's deny and allow lists, which are files re-read
//! when they change (checked at most once a second, on the create path; no watcher thread).
//! A list that cannot be read or has bad lines keeps the last good version and is logged; at
//! start a configured list must be readable.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use zlink_wire::destination::{self, Policy, PolicyError};

/// How often the list files' modification times are looked at.
const RECHECK: Duration = Duration::from_secs(1);

struct ListFile {
    path: PathBuf,
    modified: Option<SystemTime>,
    len: u64,
}

struct State {
    policy: Arc<Policy>,
    deny: Option<ListFile>,
    allow: Option<ListFile>,
    checked: Instant,
}

pub struct Destinations {
    state: Mutex<State>,
}

fn read_list(path: &PathBuf) -> Result<(Vec<String>, SystemTime, u64), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (hosts, bad) = destination::parse_list(&text);
    if !bad.is_empty() {
        tracing::warn!(file = %path.display(), lines = ?bad, "host list: lines that are not a host were ignored");
    }
    Ok((
        hosts,
        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        meta.len(),
    ))
}

impl Destinations {
    /// `own_domains`: the service's short domains; `deny`/`allow`: optional list files.
    pub fn new(
        own_domains: Vec<String>,
        deny: Option<PathBuf>,
        allow: Option<PathBuf>,
    ) -> Result<Self, String> {
        let mut policy = Policy {
            own_domains: own_domains
                .iter()
                .filter_map(|d| destination::list_entry(d))
                .collect(),
            ..Policy::default()
        };
        let load = |p: Option<PathBuf>, into: &mut Vec<String>| -> Result<_, String> {
            p.map(|path| {
                let (hosts, modified, len) = read_list(&path)?;
                *into = hosts;
                Ok(ListFile {
                    path,
                    modified: Some(modified),
                    len,
                })
            })
            .transpose()
        };
        let deny = load(deny, &mut policy.deny)?;
        let allow = load(allow, &mut policy.allow)?;
        Ok(Destinations {
            state: Mutex::new(State {
                policy: Arc::new(policy),
                deny,
                allow,
                checked: Instant::now(),
            }),
        })
    }

    /// The policy now, re-reading a list file whose modification time or size changed.
    pub fn current(&self) -> Arc<Policy> {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *guard;
        if st.checked.elapsed() >= RECHECK {
            st.checked = Instant::now();
            let mut next = (*st.policy).clone();
            let mut changed = false;
            for (file, list) in [
                (&mut st.deny, &mut next.deny),
                (&mut st.allow, &mut next.allow),
            ] {
                let Some(f) = file else { continue };
                let now = std::fs::metadata(&f.path)
                    .ok()
                    .map(|m| (m.modified().ok(), m.len()));
                if now == Some((f.modified, f.len)) {
                    continue;
                }
                match read_list(&f.path) {
                    Ok((hosts, modified, len)) => {
                        tracing::info!(file = %f.path.display(), hosts = hosts.len(), "host list reloaded");
                        *list = hosts;
                        (f.modified, f.len) = (Some(modified), len);
                        changed = true;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "host list unreadable; keeping the last good one")
                    }
                }
            }
            if changed {
                st.policy = Arc::new(next);
            }
        }
        st.policy.clone()
    }

    /// True when `name` is one of the service's own short domains or under one.
    pub fn is_own_domain(&self, name: &str) -> bool {
        destination::in_list(name, &self.current().own_domains)
    }

    /// Checks a normalised destination URL.
    pub fn check(&self, normalized: &str) -> Result<(), PolicyError> {
        let url = url::Url::parse(normalized).map_err(|_| PolicyError::NoHost)?;
        destination::check(&url, &self.current())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_deny_list_is_picked_up_and_a_broken_one_keeps_the_last() {
        let dir = std::env::temp_dir().join(format!("zlink-policy-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let deny = dir.join("deny");
        std::fs::write(&deny, "evil.example\n").unwrap();
        let d = Destinations::new(vec!["zl.example".into()], Some(deny.clone()), None).unwrap();
        assert!(d.check("https://a.evil.example/").is_err());
        assert!(d.check("https://good.example/").is_ok());
        assert_eq!(
            d.check("https://zl.example/x").unwrap_err().code(),
            "destination_own_domain"
        );
        std::fs::write(&deny, "good.example # now this one\n").unwrap();
        d.state.lock().unwrap().checked -= RECHECK;
        assert!(d.check("https://a.evil.example/").is_ok());
        assert!(d.check("https://good.example/").is_err());
        std::fs::remove_file(&deny).unwrap();
        d.state.lock().unwrap().checked -= RECHECK;
        assert!(
            d.check("https://good.example/").is_err(),
            "last good list kept"
        );
        assert!(Destinations::new(vec![], Some(deny), None).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
