//! The server's sandboxes: which API key made each, its E2B attributes (template,
//! metadata, access token, end time), the live sandbox under it, and the reaper that ends
//! each at its end time.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use std::path::PathBuf;

use strata::live::{LiveSandbox, SnapshotStore, StartOptions};
use strata::{BackendKind, Caps, Error, Net, Sandbox, Strictness};

/// The home and working directory of the base template's user, as in E2B's templates.
pub const HOME: &str = "/home/user";
/// The base template's user.
pub const USER: &str = "user";
/// The envd version this server speaks (the SDKs gate features on it).
pub const ENVD_VERSION: &str = "0.6.4";
/// The longest timeout a client may set, seconds (E2B's own cap for paid teams: 24 h).
pub const MAX_TIMEOUT_S: u64 = 24 * 3600;
/// The timeout of a sandbox created without one, seconds (the SDKs' default).
pub const DEFAULT_TIMEOUT_S: u64 = 300;

/// A process started through the process service: what it was started with.
#[derive(Clone, Debug)]
pub struct ProcessRecord {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub tag: Option<String>,
    /// Started on a terminal (its output is the `pty` stream).
    pub tty: bool,
}

/// One E2B sandbox.
pub struct Entry {
    pub id: String,
    /// The API key (its index in the server's keys) that made it: no other key sees it.
    pub key: usize,
    pub template: String,
    pub metadata: BTreeMap<String, String>,
    /// Required on every envd call (`X-Access-Token`) and the key of signed file URLs.
    pub access_token: String,
    /// The `Idempotency-Key` it was made with: the same key and token answer this sandbox.
    pub idempotency: Option<String>,
    /// Pause at the end time instead of ending (`autoPause`).
    pub auto_pause: bool,
    /// Whether it has any network.
    pub internet: bool,
    pub started_at: SystemTime,
    pub end_at: Mutex<SystemTime>,
    pub paused: AtomicBool,
    pub live: LiveSandbox,
    pub processes: Mutex<HashMap<i32, ProcessRecord>>,
    pub watchers: Mutex<HashMap<String, Arc<crate::e2b::filesystem::Watcher>>>,
    /// Streams open now (exec output, watches), bounded by [`MAX_STREAMS`].
    pub streams: Arc<tokio::sync::Semaphore>,
    /// Ports reached through `get_host(port)`: the port inside to the host loopback port
    /// its live sandbox publishes it on (published on first use).
    pub ports: Mutex<HashMap<u16, u16>>,
    /// Required (`e2b-traffic-access-token`) on connections to its ports when it was made
    /// with `network.allowPublicTraffic: false`; `None`: whoever reaches the server may.
    pub traffic_token: Option<String>,
}

/// The most streams (process output, directory watches) one sandbox has open at once.
pub const MAX_STREAMS: usize = 64;

impl Entry {
    /// The end time.
    pub fn end_at(&self) -> SystemTime {
        *lock(&self.end_at)
    }

    /// Sets the end time to `timeout` from now.
    pub fn set_timeout(&self, timeout: Duration) {
        *lock(&self.end_at) = SystemTime::now() + timeout;
    }

    /// Moves the end time to `timeout` from now if that is later (never earlier).
    pub fn extend(&self, timeout: Duration) {
        let mut end = lock(&self.end_at);
        let asked = SystemTime::now() + timeout;
        if asked > *end {
            *end = asked;
        }
    }

    /// Whether `token` is this sandbox's access token (constant time).
    pub fn token_matches(&self, token: &str) -> bool {
        same_secret(token, &self.access_token)
    }
}

/// Locks `mutex`, taking the data of a poisoned one (a panicked handler leaves it whole).
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Whether `sent` is `secret`, compared as SHA-256 digests in constant time (the time
/// tells nothing of how much of it matched, nor of its length).
pub fn same_secret(sent: &str, secret: &str) -> bool {
    digest(sent).ct_eq(&digest(secret)).into()
}

/// SHA-256 of `text` (keys and tokens are compared as digests, in constant time).
pub fn digest(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// A template: the profile a sandbox of that name starts with.
pub struct Template {
    /// The sandbox (profile: backend, strictness, tier, audit log) its sandboxes start on.
    pub sandbox: Sandbox,
    /// The profile's caps: every sandbox gets these (a client can only narrow the network).
    pub caps: Caps,
    /// The live backend.
    pub backend: BackendKind,
    /// The profile's strictness.
    pub strictness: Strictness,
}

/// How the server was configured.
pub struct Settings {
    /// The template `base` (`--profile`'s): its audit log records the server's calls, and
    /// its tier admits sandboxes started from snapshots.
    pub base: Template,
    /// The other templates by name (each `--template NAME=PROFILE`).
    pub templates: BTreeMap<String, Template>,
    /// The API keys (SHA-256 of each, compared in constant time).
    pub keys: Vec<[u8; 32]>,
    /// The most sandboxes one key has at once.
    pub max_per_key: usize,
    /// Where snapshots are kept: one store per API key under it, and `forks/` for the
    /// snapshot a fork starts its children from (removed once they started).
    pub snapshot_dir: PathBuf,
}

impl Settings {
    /// The template `base`.
    pub fn base(&self) -> &Template {
        &self.base
    }

    /// The template `name`, if the server has one of that name.
    pub fn template(&self, name: &str) -> Option<&Template> {
        if name == crate::e2b::control::BASE_TEMPLATE {
            Some(&self.base)
        } else {
            self.templates.get(name)
        }
    }
}

/// The server's sandboxes.
pub struct Registry {
    pub settings: Settings,
    entries: Mutex<HashMap<String, Arc<Entry>>>,
    /// Held while a sandbox is being made, per key: the count check and the insert are one
    /// step even though starting takes a while.
    starting: Mutex<HashMap<usize, usize>>,
    /// The E2B id of every live sandbox this server made (a snapshot names its source by
    /// the live sandbox's id), kept after the sandbox ends.
    sources: Mutex<HashMap<String, String>>,
}

impl Registry {
    pub fn new(settings: Settings) -> Registry {
        Registry {
            settings,
            entries: Mutex::new(HashMap::new()),
            starting: Mutex::new(HashMap::new()),
            sources: Mutex::new(HashMap::new()),
        }
    }

    /// The snapshot store of API key `key`: `<snapshot dir>/<a hash of the key>`, 0700.
    /// Another key's snapshots are not in it.
    ///
    /// # Errors
    /// As [`SnapshotStore::open`].
    pub fn snapshots(&self, key: usize) -> Result<SnapshotStore, Error> {
        let digest = self
            .settings
            .keys
            .get(key)
            .ok_or_else(|| Error::invalid("an API key this server does not have"))?;
        let namespace: [u8; 32] = Sha256::digest(digest).into();
        let hex: String = namespace[..8].iter().map(|b| format!("{b:02x}")).collect();
        self.open_store(&format!("key-{hex}"))
    }

    /// The store of the snapshots forks start from (each removed once its children did).
    ///
    /// # Errors
    /// As [`SnapshotStore::open`].
    pub fn fork_store(&self) -> Result<SnapshotStore, Error> {
        self.open_store("forks")
    }

    fn open_store(&self, name: &str) -> Result<SnapshotStore, Error> {
        // Made 0700, with its parents, when missing.
        SnapshotStore::open(&self.settings.snapshot_dir.join(name))
    }

    /// The E2B id of the live sandbox `live_id`, if this server made it.
    pub fn e2b_id_of(&self, live_id: &str) -> Option<String> {
        lock(&self.sources).get(live_id).cloned()
    }

    /// The index of the API key `key`, if it is one of the server's (constant time per key).
    pub fn key_index(&self, key: &str) -> Option<usize> {
        let asked = digest(key);
        let mut found = None;
        for (index, known) in self.settings.keys.iter().enumerate() {
            if bool::from(known.ct_eq(&asked)) {
                found = Some(index);
            }
        }
        found
    }

    /// Sandbox `id` of key `key` (another key's is "not found", as a missing one is).
    pub fn get(&self, key: usize, id: &str) -> Option<Arc<Entry>> {
        lock(&self.entries)
            .get(id)
            .filter(|entry| entry.key == key)
            .cloned()
    }

    /// Sandbox `id`, whoever made it (envd calls are authorised by its access token).
    pub fn get_any(&self, id: &str) -> Option<Arc<Entry>> {
        lock(&self.entries).get(id).cloned()
    }

    /// Every sandbox of `key`.
    pub fn of_key(&self, key: usize) -> Vec<Arc<Entry>> {
        lock(&self.entries)
            .values()
            .filter(|entry| entry.key == key)
            .cloned()
            .collect()
    }

    /// Every sandbox.
    pub fn all(&self) -> Vec<Arc<Entry>> {
        lock(&self.entries).values().cloned().collect()
    }

    /// Reserves a place for one more sandbox of `key`.
    ///
    /// # Errors
    /// The key has `max_per_key` sandboxes (running, paused or starting).
    pub fn reserve(&self, key: usize) -> Result<Reservation<'_>, String> {
        let running = self.of_key(key).len();
        let mut starting = lock(&self.starting);
        let pending = starting.entry(key).or_insert(0);
        if running + *pending >= self.settings.max_per_key {
            return Err(format!(
                "this API key has {} sandboxes (the server's --max-sandboxes); kill one first",
                self.settings.max_per_key
            ));
        }
        *pending += 1;
        Ok(Reservation {
            registry: self,
            key,
        })
    }

    /// Adds a started sandbox.
    pub fn insert(&self, entry: Entry) -> Arc<Entry> {
        let entry = Arc::new(entry);
        lock(&self.sources).insert(entry.live.id().to_string(), entry.id.clone());
        lock(&self.entries).insert(entry.id.clone(), entry.clone());
        entry
    }

    /// Takes sandbox `id` out (the caller stops it).
    pub fn remove(&self, id: &str) -> Option<Arc<Entry>> {
        lock(&self.entries).remove(id)
    }

    /// Every running sandbox whose end time has passed (paused ones wait): those made
    /// with `autoPause` stay in (the caller pauses them), the others are taken out (the
    /// caller stops them).
    pub fn expired(&self) -> (Vec<Arc<Entry>>, Vec<Arc<Entry>>) {
        let now = SystemTime::now();
        let mut entries = lock(&self.entries);
        let due: Vec<Arc<Entry>> = entries
            .values()
            .filter(|entry| !entry.paused.load(Ordering::SeqCst) && entry.end_at() <= now)
            .cloned()
            .collect();
        let (pause, stop): (Vec<_>, Vec<_>) = due.into_iter().partition(|e| e.auto_pause);
        for entry in &stop {
            entries.remove(&entry.id);
        }
        (pause, stop)
    }

    /// Takes out every sandbox (at shutdown).
    pub fn drain(&self) -> Vec<Arc<Entry>> {
        lock(&self.entries)
            .drain()
            .map(|(_, entry)| entry)
            .collect()
    }

    /// The caps of a new sandbox of `template`: its profile's, with E2B's home as working
    /// directory and environment, `env` on top, and the network narrowed to `net` when
    /// asked.
    pub fn template_caps(
        &self,
        template: &Template,
        env: &BTreeMap<String, String>,
        net: Option<Net>,
    ) -> Result<Caps, Error> {
        let mut caps = template.caps.clone();
        caps.workdir = Some(HOME.into());
        for (key, value) in [
            ("HOME", HOME),
            ("USER", USER),
            ("LOGNAME", USER),
            ("PWD", HOME),
            ("SHELL", "/bin/bash"),
        ] {
            caps.env.entry(key.into()).or_insert_with(|| value.into());
        }
        for (key, value) in env {
            caps.env.insert(key.clone(), value.clone());
        }
        if let Some(net) = net {
            caps.net = net;
        }
        caps.validate()?;
        Ok(caps)
    }

    /// Options of a new live sandbox of `template`: owned by this server (it ends with the
    /// server), on the template's backend.
    pub fn start_options(&self, template: &Template) -> StartOptions {
        StartOptions {
            backend: template.backend,
            strictness: template.strictness,
            owned: true,
            ..StartOptions::default()
        }
    }
}

/// A place for a sandbox being started; released when dropped.
pub struct Reservation<'a> {
    registry: &'a Registry,
    key: usize,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut starting = lock(&self.registry.starting);
        if let Some(pending) = starting.get_mut(&self.key) {
            *pending = pending.saturating_sub(1);
        }
    }
}

/// A random token: `bytes` bytes of OS randomness in hex.
pub fn random_hex(bytes: usize) -> Result<String, Error> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf)
        .map_err(|e| Error::internal("make a token", std::io::Error::other(e.to_string())))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Seconds since the epoch.
pub fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// RFC 3339 (UTC, seconds) of `time`.
pub fn rfc3339(time: SystemTime) -> String {
    let secs = unix_seconds(time);
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = i64::try_from(days).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_matches_known_dates() {
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_241_600);
        assert_eq!(rfc3339(t), "2026-12-02T20:00:00Z");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00Z");
    }
}
