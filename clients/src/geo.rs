//! Country and city of a client address, from a MaxMind-format database (GeoLite2/GeoIP2 City
//! or Country, or any database with their `country.iso_code` and `city.names.en` fields), looked
//! up where the click happens so that only the IP hash and the place travel on.
//!
//! Fail-open: no database configured, a missing or unreadable file, or an address the database
//! does not know all give `(None, None)`, never an error or a slower redirect. Hot reload: at
//! most every `check_every` a lookup `stat`s the file; if its size, mtime or inode changed, a
//! background thread reads the new file and swaps it in (the request never waits for a load).
//! A new file that does not parse leaves the last good database in place (logged, counted).

use prometheus::IntCounterVec;
use serde::Deserialize;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// Longest city name kept (bytes, cut on a character boundary).
const MAX_CITY: usize = 64;

type Reader = maxminddb::Reader<Vec<u8>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime_ns: i128,
    ino: u64,
}

pub struct Geo {
    path: Option<PathBuf>,
    check_every_ms: i64,
    db: RwLock<Option<Arc<Reader>>>,
    /// What the loaded (or last tried) file looked like.
    stamp: Mutex<Option<Stamp>>,
    next_check_ms: AtomicI64,
    loading: AtomicBool,
    /// Loads by outcome (`ok`, `error`), when a registry wants them.
    loads: Option<IntCounterVec>,
}

#[derive(Deserialize)]
struct Record<'a> {
    #[serde(borrow)]
    country: Option<Country<'a>>,
    #[serde(borrow)]
    city: Option<City<'a>>,
}

#[derive(Deserialize)]
struct Country<'a> {
    iso_code: Option<&'a str>,
}

#[derive(Deserialize)]
struct City<'a> {
    #[serde(borrow)]
    names: Option<Names<'a>>,
}

/// Only the English name: the other languages are skipped, not decoded into a map.
#[derive(Deserialize)]
struct Names<'a> {
    en: Option<&'a str>,
}

impl Geo {
    /// No database: every lookup is unknown.
    pub fn none() -> Arc<Geo> {
        Arc::new(Geo::new(None, Duration::from_secs(10), None))
    }

    /// Opens `path` now (a failure is logged and leaves the lookups unknown until a good file
    /// appears there) and checks it for changes at most every `check_every`.
    pub fn open(
        path: Option<PathBuf>,
        check_every: Duration,
        loads: Option<IntCounterVec>,
    ) -> Arc<Geo> {
        let geo = Geo::new(path, check_every, loads);
        geo.reload();
        Arc::new(geo)
    }

    fn new(path: Option<PathBuf>, check_every: Duration, loads: Option<IntCounterVec>) -> Geo {
        Geo {
            path: path.filter(|p| !p.as_os_str().is_empty()),
            check_every_ms: check_every.as_millis() as i64,
            db: RwLock::new(None),
            stamp: Mutex::new(None),
            next_check_ms: AtomicI64::new(crate::now_ms() + check_every.as_millis() as i64),
            loading: AtomicBool::new(false),
            loads,
        }
    }

    /// Whether a database is loaded.
    pub fn loaded(&self) -> bool {
        self.db.read().map(|d| d.is_some()).unwrap_or(false)
    }

    /// ISO country code and city name of `ip`, each `None` when unknown.
    pub fn locate(self: &Arc<Self>, ip: IpAddr) -> (Option<String>, Option<String>) {
        self.maybe_check();
        let Some(db) = self.db.read().ok().and_then(|d| d.clone()) else {
            return (None, None);
        };
        let Ok(found) = db.lookup(ip) else {
            return (None, None);
        };
        let Ok(Some(rec)) = found.decode::<Record>() else {
            return (None, None);
        };
        let country = rec
            .country
            .and_then(|c| c.iso_code)
            .filter(|c| c.len() == 2 && c.bytes().all(|b| b.is_ascii_uppercase()))
            .map(str::to_string);
        let city = rec
            .city
            .and_then(|c| c.names)
            .and_then(|n| n.en)
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(|c| {
                let mut end = c.len().min(MAX_CITY);
                while !c.is_char_boundary(end) {
                    end -= 1;
                }
                c[..end].to_string()
            });
        (country, city)
    }

    fn maybe_check(self: &Arc<Self>) {
        if self.path.is_none() {
            return;
        }
        let now = crate::now_ms();
        let due = self.next_check_ms.load(Ordering::Relaxed);
        if now < due
            || self
                .next_check_ms
                .compare_exchange(
                    due,
                    now + self.check_every_ms,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        if self.current_stamp() == *self.stamp.lock().expect("stamp lock") {
            return;
        }
        if self.loading.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        let spawned = std::thread::Builder::new()
            .name("geoip-load".into())
            .spawn(move || {
                this.reload();
                this.loading.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.loading.store(false, Ordering::Release);
        }
    }

    fn current_stamp(&self) -> Option<Stamp> {
        let m = std::fs::metadata(self.path.as_ref()?).ok()?;
        Some(Stamp {
            len: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ino: m.ino(),
        })
    }

    /// Loads the file if it changed since the last load (or try). True if a database is in
    /// place afterwards.
    pub fn reload(&self) -> bool {
        let Some(path) = &self.path else {
            return false;
        };
        let stamp = self.current_stamp();
        *self.stamp.lock().expect("stamp lock") = stamp;
        let outcome = std::fs::read(path)
            .map_err(|e| e.to_string())
            .and_then(|bytes| Reader::from_source(bytes).map_err(|e| e.to_string()));
        match outcome {
            Ok(reader) => {
                tracing::info!(path = %path.display(), db_type = %reader.metadata.database_type,
                    "GeoIP database loaded");
                *self.db.write().expect("geo lock") = Some(Arc::new(reader));
                self.count("ok");
            }
            Err(e) => {
                let keeping = self.loaded();
                tracing::warn!(path = %path.display(), error = %e, keeping_previous = keeping,
                    "GeoIP database not loaded; clicks count as unknown place unless a previous one is kept");
                self.count("error");
            }
        }
        self.loaded()
    }

    fn count(&self, outcome: &str) {
        if let Some(l) = &self.loads {
            l.with_label_values(&[outcome]).inc();
        }
    }
}

/// Writes a City-shaped database at `path` (atomically: a temporary file renamed over it):
/// each network with its country code and maybe a city name. For tests and the local
/// topology's sample database; needs the `test-db` feature outside this crate's tests.
#[cfg(any(test, feature = "test-db"))]
pub fn write_test_db(
    path: &std::path::Path,
    nets: &[(&str, &str, Option<&str>)],
) -> Result<(), String> {
    use serde::Serialize;
    #[derive(Serialize)]
    struct Names<'a> {
        en: &'a str,
    }
    #[derive(Serialize)]
    struct CountryRec<'a> {
        iso_code: &'a str,
    }
    #[derive(Serialize)]
    struct CityRec<'a> {
        names: Names<'a>,
    }
    #[derive(Serialize)]
    struct Rec<'a> {
        country: CountryRec<'a>,
        #[serde(skip_serializing_if = "Option::is_none")]
        city: Option<CityRec<'a>>,
    }
    let mut w = mmdb_writer::Writer::new("zlink-test-City");
    for (net, cc, city) in nets {
        let rec = Rec {
            country: CountryRec { iso_code: cc },
            city: city.map(|c| CityRec {
                names: Names { en: c },
            }),
        };
        let net: ipnet::IpNet = net.parse().map_err(|e| format!("{net}: {e}"))?;
        w.insert(net, &rec).map_err(|e| e.to_string())?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, w.to_bytes().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_db(path: &std::path::Path, nets: &[(&str, &str, Option<&str>)]) {
        write_test_db(path, nets).unwrap();
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn some(cc: &str, city: Option<&str>) -> (Option<String>, Option<String>) {
        (Some(cc.to_string()), city.map(str::to_string))
    }

    #[test]
    fn looks_up_countries_and_cities_and_fails_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("city.mmdb");
        write_db(
            &path,
            &[
                ("203.0.113.0/24", "DE", Some("Berlin")),
                ("2001:db8::/32", "JP", Some("Tokyo")),
                ("198.51.100.0/24", "US", None),
                ("192.0.2.0/24", "zz", Some("Nowhere")),
            ],
        );
        let geo = Geo::open(Some(path), Duration::from_secs(60), None);
        assert_eq!(geo.locate(ip("203.0.113.9")), some("DE", Some("Berlin")));
        assert_eq!(geo.locate(ip("2001:db8::1")), some("JP", Some("Tokyo")));
        assert_eq!(geo.locate(ip("198.51.100.1")), some("US", None));
        assert_eq!(
            geo.locate(ip("10.0.0.1")),
            (None, None),
            "not in the database"
        );
        assert_eq!(
            geo.locate(ip("192.0.2.1")),
            (None, Some("Nowhere".into())),
            "a malformed country code is unknown"
        );
        for bad in [None, Some(dir.path().join("missing.mmdb"))] {
            let g = Geo::open(bad, Duration::from_secs(60), None);
            assert!(!g.loaded());
            assert_eq!(g.locate(ip("203.0.113.9")), (None, None));
        }
        let garbage = dir.path().join("garbage.mmdb");
        std::fs::write(&garbage, b"not a database").unwrap();
        let g = Geo::open(Some(garbage), Duration::from_secs(60), None);
        assert_eq!(g.locate(ip("203.0.113.9")), (None, None));
    }

    #[test]
    fn a_changed_file_is_swapped_in_and_a_bad_one_keeps_the_last_good() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("city.mmdb");
        write_db(&path, &[("203.0.113.0/24", "DE", Some("Berlin"))]);
        let geo = Geo::open(Some(path.clone()), Duration::ZERO, None);
        assert_eq!(geo.locate(ip("203.0.113.9")), some("DE", Some("Berlin")));
        write_db(&path, &[("203.0.113.0/24", "FR", Some("Paris"))]);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while geo.locate(ip("203.0.113.9")) != some("FR", Some("Paris")) {
            assert!(std::time::Instant::now() < deadline, "reloaded");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::write(&path, b"truncated").unwrap();
        assert!(geo.reload(), "a database is still in place");
        assert_eq!(
            geo.locate(ip("203.0.113.9")),
            some("FR", Some("Paris")),
            "the last good database stays"
        );
    }
}
