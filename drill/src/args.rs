//! The drill's command line: the topology's endpoints, the faults and phases, the load, the
//! targets each phase is judged against, and the break/restore command hooks.

use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "drill", about = "zlink failover drill")]
pub struct Args {
    /// The frontend nginx (redirects and the API go through it): `https://` as people use it
    /// (`ctl drill` passes the HTTPS listener), or `http://`.
    #[arg(long, env = "ZLINK_FRONTEND")]
    pub frontend: String,
    /// A CA to trust besides the public ones (the local CA that issued the sites' certificates).
    #[arg(long, env = "ZLINK_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// URL prefix of the blobs in S3 (bucket and key prefix): `<prefix><slug>` is read to know
    /// a link reached S3 before the drill starts.
    #[arg(long, env = "ZLINK_DRILL_BLOB_URL_PREFIX")]
    pub blob_url_prefix: String,
    /// An admin API key (creates the drill's links, reads their stats).
    #[arg(long, env = "ZLINK_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: String,
    /// Components that are the primaries (comma-separated names for the hooks).
    #[arg(long, value_delimiter = ',', default_value = "primary-1,primary-2")]
    pub primaries: Vec<String>,
    /// Components that are the lastresort processes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lastresort-1,lastresort-2"
    )]
    pub lastresorts: Vec<String>,
    /// Components of another tier: `TIER=comp,comp` (defaults: store=cassandra,
    /// memcached=memcached, kafka=kafka, replicator=replicator, s3=s3).
    #[arg(long = "tier")]
    pub tiers: Vec<String>,
    /// Tiers with a fault proxy in front (where slow and blackhole can be injected).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "primaries,lastresorts,store,memcached,s3"
    )]
    pub proxied: Vec<String>,
    /// A scenario: `KIND:TIER` (kill|hang|slow|blackhole|flap|restart : a tier), `ladder:KIND`
    /// (primaries, then lastresorts too, then back) or `rolling` (the `rolling` tier restarted
    /// one component at a time). Repeatable; default `ladder:kill`.
    #[arg(long = "fault")]
    pub faults: Vec<String>,
    /// The CI set: both ladders (kill, hang) and a kill and a hang of every other tier.
    #[arg(long)]
    pub fast: bool,
    /// Every kind on every tier (slow/blackhole where proxied) and both ladders.
    #[arg(long)]
    pub matrix: bool,
    /// Tiers that are one replica of a replicated engine (a store node, a broker; each its own
    /// tier, by default the component of the same name): a fault of one must be invisible (every
    /// create answered 201, redirects on rung 1, ε held).
    #[arg(long, value_delimiter = ',')]
    pub replicas: Vec<String>,
    /// The clustered set: every --replicas tier killed and hung, then the rolling restart (the
    /// `rolling` tier's components restarted one at a time under load).
    #[arg(long)]
    pub cluster: bool,
    /// The network-cut set (network-namespace mode): the WAN between the sites cut, then the
    /// primary site's S3 blackholed. Use with --site.
    #[arg(long)]
    pub netcut: bool,
    /// The last-resort site's public address as its own users reach it: half of the load goes
    /// there directly (every answer held to the same checks), the other half to the frontend.
    #[arg(long)]
    pub site: Option<String>,
    /// Breaks one component; `{kind}` and `{component}` are replaced.
    #[arg(long, default_value = "deploy/local/ctl fault {kind} {component}")]
    pub break_cmd: String,
    /// Restores one component and returns once it is ready.
    #[arg(long, default_value = "deploy/local/ctl heal {kind} {component}")]
    pub restore_cmd: String,
    /// Checks the mappings after the drill; exit status 0 = no drift.
    #[arg(long, default_value = "deploy/local/ctl reconcile --dry-run")]
    pub reconcile_cmd: String,
    /// Repairs drift the check found (what an SRE runs after an S3 incident); then the check
    /// runs again and only drift that survives the repair fails the drill. Empty: no repair.
    #[arg(long, default_value = "deploy/local/ctl reconcile")]
    pub repair_cmd: String,
    /// Links per phase (each phase requests only its own, so its clicks can be counted).
    #[arg(long, default_value_t = 4)]
    pub links: usize,
    /// A branded domain the drill registers (admin key) and puts the last link of every phase
    /// on, requested with that `Host` on every rung. Empty: every link on the default domain.
    #[arg(long, default_value = "brand.zlink.test")]
    pub brand_domain: String,
    /// Redirects per second through the frontend.
    #[arg(long, default_value_t = 100)]
    pub rate: u32,
    /// Seconds of load per phase (after its actions).
    #[arg(long, default_value_t = 10)]
    pub phase_seconds: u64,
    /// A flapping component is down this long, then up this long, and so on.
    #[arg(long, default_value_t = 2)]
    pub flap_seconds: u64,
    /// Target: p99 added over the baseline once a single-tier fault has settled, ms.
    #[arg(long, default_value_t = 300.0)]
    pub max_added_p99_ms: f64,
    /// Target: no redirect slower than this under a single-tier fault, ms.
    #[arg(long, default_value_t = 1000.0)]
    pub max_ms: f64,
    /// The first part of a phase (the first timeout window) is left out of its settled p99.
    #[arg(long, default_value_t = 1000)]
    pub settle_ms: u64,
    /// The last-resort host (its nginx): the drill's writer checks each new link is served there.
    #[arg(long, env = "ZLINK_LASTRESORT_NGINX")]
    pub lastresort_host: Option<String>,
    /// The writer creates a link this often (0: no writer) and times create → every rung.
    #[arg(long, default_value_t = 1000)]
    pub create_every_ms: u64,
    /// Target: a link created while the write path is whole reaches every rung within ε, ms.
    #[arg(long, default_value_t = 5000.0)]
    pub eps_ms: f64,
    /// How long to wait for every click to be counted after the last phase, seconds.
    #[arg(long, default_value_t = 180)]
    pub clicks_within_s: u64,
    /// Alertmanager: the drill records which alerts fire and resolve (polled every second),
    /// shows them per phase and on the timeline, and holds the ladder's and broken tiers'
    /// alerts to their phases (see --alert-window-s).
    #[arg(long, env = "ZLINK_ALERTMANAGER")]
    pub alertmanager: Option<String>,
    /// Expected alerts are judged only when phases last at least this long (the rules'
    /// windows: rate over 30 s, `for:` 10-30 s, 5 s scrapes); shorter phases only record them.
    #[arg(long, default_value_t = 45)]
    pub alert_window_s: u64,
    /// Where the JSON report goes; the HTML page goes next to it (`.html`).
    #[arg(long, default_value = "drill-report.json")]
    pub report: String,
}
