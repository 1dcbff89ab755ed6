//! Servers a test owns and may kill or cut off: Kafka, S3 and memcached of its own.

use super::*;

/// A server of the test's own (a lib.sh component: kafka, s3), started and stopped through
/// deploy/local/lib.sh, so a test can stop it without disturbing any other test.
pub struct OwnServer {
    component: &'static str,
    run_dir: TempDir,
    port_base: u16,
}

/// A Kafka broker of the test's own.
pub struct OwnKafka {
    pub brokers: String,
    server: OwnServer,
}

/// A SeaweedFS S3 of the test's own (bucket and credentials as in the shared one).
pub struct OwnS3 {
    pub endpoint: String,
    server: OwnServer,
}

impl OwnServer {
    fn lib(&self, action: &str) -> bool {
        std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("source deploy/local/lib.sh && {action}"))
            .current_dir(repo_root())
            .env("ZLINK_RUN", self.run_dir.path())
            .env("ZLINK_PORT_BASE", self.port_base.to_string())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// Its port `name` (deploy/local/topology.tsv, the table lib.sh starts it by).
    fn port(&self, name: &str) -> u16 {
        zlink_xtask::topology::Topology::load(&repo_root())
            .and_then(|t| t.port(self.port_base, name))
            .expect("deploy/local/topology.tsv names the port")
    }

    fn new(component: &'static str, port_base: u16) -> OwnServer {
        OwnServer {
            component,
            run_dir: TempDir::new(component),
            port_base,
        }
    }

    pub async fn up(&self) {
        let c = self.component;
        let ok =
            tokio::task::block_in_place(|| self.lib(&format!("zl_start {c} && zl_wait_ready {c}")));
        assert!(ok, "private {c} did not start");
    }

    pub async fn stop(&self) {
        let c = self.component;
        let ok = tokio::task::block_in_place(|| self.lib(&format!("zl_stop {c} 20")));
        assert!(ok, "private {c} did not stop");
    }

    /// Freezes the server (`SIGSTOP` to its process group: connections still accepted, nothing
    /// answered) or thaws it and waits until it is ready again — lib.sh's `hang` fault.
    pub async fn freeze(&self, frozen: bool) {
        let (c, action) = (self.component, if frozen { "fault" } else { "heal" });
        let ok = tokio::task::block_in_place(|| self.lib(&format!("zl_fault {action} hang {c}")));
        assert!(ok, "private {c}: {action} hang");
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.lib(&format!("zl_kill {}", self.component));
    }
}

impl OwnKafka {
    pub async fn start(port_base: u16) -> OwnKafka {
        let server = OwnServer::new("kafka", port_base);
        let k = OwnKafka {
            brokers: format!("127.0.0.1:{}", server.port("kafka")),
            server,
        };
        k.server.up().await;
        k
    }
    pub async fn up(&self) {
        self.server.up().await
    }
    pub async fn stop(&self) {
        self.server.stop().await
    }
    pub async fn freeze(&self, frozen: bool) {
        self.server.freeze(frozen).await
    }
}

impl OwnS3 {
    pub async fn start(port_base: u16) -> OwnS3 {
        let server = OwnServer::new("s3", port_base);
        let s = OwnS3 {
            endpoint: format!("http://127.0.0.1:{}", server.port("s3")),
            server,
        };
        s.server.up().await;
        s
    }
    pub async fn up(&self) {
        self.server.up().await
    }
    pub async fn stop(&self) {
        self.server.stop().await
    }
}

pub struct OwnMemcached {
    pub addr: String,
    child: std::process::Child,
}

impl OwnMemcached {
    pub async fn start() -> OwnMemcached {
        let port = free_port();
        let mut cmd = std::process::Command::new("memcached");
        cmd.args([
            "-l",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "0",
            "-m",
            "16",
        ]);
        // memcached refuses to run as root without -u.
        if is_root() {
            cmd.args(["-u", "root"]);
        }
        let child = cmd
            .spawn()
            .expect("memcached binary (installed by deploy/local/install)");
        let addr = format!("127.0.0.1:{port}");
        let a = addr.clone();
        assert!(
            eventually(Duration::from_secs(10), || {
                let a = a.clone();
                async move { tokio::net::TcpStream::connect(a).await.is_ok() }
            })
            .await,
            "memcached did not start"
        );
        OwnMemcached { addr, child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -{sig} memcached");
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OwnMemcached {
    fn drop(&mut self) {
        // SIGKILL works on a SIGSTOPped process too.
        self.kill();
    }
}
