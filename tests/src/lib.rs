//! Test harness for end-to-end tests against the real servers that `deploy/local/test` starts.
//!
//! One set of infrastructure per test run (addresses in `ZLINK_TEST_*`); isolation per test:
//! every test gets its own keyspace (and so its own memcached key prefix). Services run
//! in-process through the same composition roots the binaries use, on port 0.
//!
//! - [`infra`]: the shared servers, per-test keyspaces and topics, Kafka and store readers.
//! - [`services`]: primary, replicator and lastresort in-process, built by their
//!   composition roots.
//! - [`process`]: service binaries as child processes, metrics, temp dirs, ports.
//! - [`own`]: Kafka, S3 and memcached of a test's own (to kill or cut off).
//! - [`api`]: the HTTP API as a client uses it; polling helpers.
//! - [`nginx`]: real nginx from the `nginx/` templates.
//! - [`browser`]: headless Chromium through ChromeDriver (WebDriver), and a destination site.
//! - [`faults`]: Toxiproxy of the test's own (slow, blackholed links) and frozen processes.

pub mod api;
pub mod browser;
pub mod faults;
pub mod infra;
pub mod nginx;
pub mod own;
pub mod process;
pub mod services;

pub use api::*;
pub use browser::*;
pub use infra::*;
pub use nginx::*;
pub use own::*;
pub use process::*;
pub use services::*;

use primary::app::AppState;
use primary::config::{Cli, Command};
use primary::events::EventSink;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use zlink_clients::clock::{Clock, SystemClock};
use zlink_store::Db;
use zlink_store::StoreConfig;
use zlink_wire::events::{ClickEvent, ClickRef, LinkEvent};
