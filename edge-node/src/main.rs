use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use edge_node::config::{ConfigError, EdgeConfig, LogFormat, parse_log_filter};
use tokio::signal::unix::{SignalKind, signal};

/// Edge gateway: embedded MQTT broker, store-and-forward and cloud uplink.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway until SIGINT or SIGTERM. SIGHUP reads the config again: the password and
    /// ACL files and the listeners' certificates change live; other changed keys are named
    /// and wait for a restart.
    Run {
        #[arg(long, short, default_value_os_t = default_config())]
        config: PathBuf,
        /// Write the bound addresses as JSON to this file once serving (for scripts and tests).
        #[arg(long)]
        ready_file: Option<PathBuf>,
    },
    /// Load and check a config (and the files it names); print it resolved, or every problem.
    CheckConfig {
        #[arg(long, short, default_value_os_t = default_config())]
        config: PathBuf,
    },
    /// Print the built-in defaults as a config file.
    PrintDefaultConfig,
    /// Inspect the store-and-forward spool (read-only; works while the node runs).
    Spool {
        #[command(subcommand)]
        command: SpoolCommand,
    },
    /// Model versions staged on this edge.
    Models {
        #[command(subcommand)]
        command: ModelsCommand,
    },
    /// The TCO model's view of the topic classes.
    Tco {
        #[command(subcommand)]
        command: TcoCommand,
    },
    /// Add a user to a password file, or change their password (stored as an argon2 hash).
    Passwd {
        /// The password file (auth.password_file); created if missing.
        #[arg(long)]
        file: PathBuf,
        user: String,
        /// Read the password from standard input instead of prompting.
        #[arg(long)]
        password_stdin: bool,
    },
}

#[derive(Debug, Subcommand)]
enum ModelsCommand {
    /// Each model: its current version (path, SHA-256) and the versions kept, as JSON.
    List {
        #[arg(long, short, default_value_os_t = default_config())]
        config: PathBuf,
    },
    /// Make the version before the current one of NAME current again.
    Rollback {
        #[arg(long, short, default_value_os_t = default_config())]
        config: PathBuf,
        name: String,
    },
}

#[derive(Debug, Subcommand)]
enum TcoCommand {
    /// Per class: rate, GB a month, each route's monthly cost, the choice and why; then both
    /// architectures' totals. From the running node (its `/tco`) when the config's HTTP
    /// endpoint answers, else from the config's declared traffic.
    Report {
        #[arg(long, short, default_value_os_t = default_config())]
        config: PathBuf,
        /// JSON instead of the table.
        #[arg(long)]
        json: bool,
        /// Also draw the monthly cost per class and route as an SVG chart.
        #[arg(long)]
        svg: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum SpoolCommand {
    /// Records, bytes and seqs per lane and class, as JSON.
    Stats {
        #[arg(long, short, default_value_os_t = default_config())]
        config: PathBuf,
    },
    /// Every unacked record as JSON lines on stdout, for recovering data by hand.
    Export {
        #[arg(long, short, default_value_os_t = default_config())]
        config: PathBuf,
    },
    /// Write a consistent copy of the spool to FILE, while the node runs or not (copying
    /// spool.db alone misses what is still in its WAL). To restore: stop the node, put FILE in
    /// place of spool.db (removing spool.db-wal and spool.db-shm), start it; it notices the
    /// copy is older than its seq reservations and the cloud's marks decide what to resend.
    Backup {
        #[arg(long, short, default_value_os_t = default_config())]
        config: PathBuf,
        /// Where the copy goes; must not exist.
        file: PathBuf,
    },
    /// Queue a spool database of another epoch (one an earlier version moved aside as
    /// `spool.db.corrupt-<ms>`, or a replaced gateway's) to be sent: what can be read of it is
    /// salvaged into `recover/` beside the spool, and the node sends it under its own epoch
    /// before its own records (within 5 s while it runs), then deletes it.
    Recover {
        #[arg(long, short, default_value_os_t = default_config())]
        config: PathBuf,
        /// The spool database to send.
        file: PathBuf,
    },
}

/// The config file a command reads without `--config`: `$EDGE_NODE_CONFIG`, else the packaged
/// `/etc/edge-node/edge.toml` where it exists, else `config/edge.toml` (a checkout).
fn default_config() -> PathBuf {
    shared::units::default_config("EDGE_NODE_CONFIG", "/etc/edge-node/edge.toml", "config/edge.toml")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { config, ready_file } => run(&config, ready_file.as_deref()),
        Command::CheckConfig { config } => return check_config(&config),
        Command::PrintDefaultConfig => {
            print!("{}", EdgeConfig::default_toml());
            Ok(())
        }
        Command::Passwd { file, user, password_stdin } => passwd(&file, &user, password_stdin),
        Command::Spool { command } => spool(command),
        Command::Models { command } => models(command),
        Command::Tco { command: TcoCommand::Report { config, json, svg } } => tco_report(&config, json, svg.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("edge-node: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, skipping a cause whose text the message already holds
/// (our error types name their cause in their own message).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    out
}

fn load(path: &Path) -> anyhow::Result<EdgeConfig> {
    EdgeConfig::load(path).map_err(|e| match e {
        ConfigError::Invalid { path, problems } => anyhow::anyhow!(
            "config file {} has {} problem(s):\n  {}",
            path.display(),
            problems.len(),
            problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  ")
        ),
        other => other.into(),
    })
}

/// `RUST_LOG`, when set and not empty.
fn rust_log() -> Option<String> {
    std::env::var("RUST_LOG").ok().filter(|v| !v.trim().is_empty())
}

/// The log filter as SIGHUP may change it: `log.level` applies live unless `RUST_LOG` is set.
type LogLevel = tracing_subscriber::reload::Handle<tracing_subscriber::filter::Targets, tracing_subscriber::Registry>;

fn init_tracing(config: &EdgeConfig) -> LogLevel {
    use tracing_subscriber::prelude::*;
    // `target=level` directives (Targets), not EnvFilter's span and field filters: EnvFilter
    // brings the regex engine, about 5 % of the binary, and the binary is most of the idle RSS.
    let from_env = rust_log().and_then(|v| parse_log_filter(&v).ok());
    let filter = from_env.unwrap_or_else(|| parse_log_filter(&config.log.level).unwrap_or_default());
    let (filter, level) = tracing_subscriber::reload::Layer::new(filter);
    // Colour codes only where a person reads them: not in journald or a log file.
    let ansi = IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let fmt = match config.log.format {
        LogFormat::Json => fmt.json().boxed(),
        LogFormat::Text => fmt.boxed(),
    };
    tracing_subscriber::registry().with(fmt.with_filter(filter)).init();
    level
}

/// `TOKIO_WORKER_THREADS`, for a config without `[runtime] worker_threads`: checked here, as the
/// key is, because tokio panics at a value it cannot take. None: one worker per core.
fn workers_from_env() -> anyhow::Result<Option<usize>> {
    let Some(value) = std::env::var_os("TOKIO_WORKER_THREADS") else { return Ok(None) };
    let max = edge_node::config::MAX_WORKER_THREADS;
    match value.to_str().and_then(|v| v.trim().parse::<usize>().ok()).filter(|n| (1..=max).contains(n)) {
        Some(n) => Ok(Some(n)),
        None => anyhow::bail!(
            "TOKIO_WORKER_THREADS={value:?} must be a number from 1 to {max} (or unset it; [runtime] worker_threads \
             in the config takes precedence)"
        ),
    }
}

fn run(path: &Path, ready_file: Option<&Path>) -> anyhow::Result<()> {
    let config = load(path)?;
    let level = init_tracing(&config);
    // Each client costs a descriptor, and SQLite, the listeners and the uplink a few more; a
    // default soft limit of 1024 would cap broker.max_connections below what it says.
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::debug!(limit, "open file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open file limit"),
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = config.runtime.worker_threads.map_or_else(workers_from_env, |n| Ok(Some(n)))? {
        runtime.worker_threads(n);
    }
    let runtime = runtime.enable_all().build().context("cannot start the async runtime")?;
    tracing::info!(workers = runtime.metrics().num_workers(), "async runtime");
    runtime.block_on(async {
        let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
        let mut hup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
        let node = edge_node::Node::start(config).await?;
        if let Some(path) = ready_file {
            write_ready_file(path, &node).with_context(|| format!("cannot write {}", path.display()))?;
        }
        tracing::info!(node_id = %node.config().node_id, "edge-node running");
        shared::service::tell("READY=1\nSTATUS=serving");
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                _ = hup.recv() => reload(path, &node, &level),
            }
        }
        tracing::info!("shutting down");
        shared::service::tell("STOPPING=1");
        node.shutdown(Duration::from_secs(5)).await;
        Ok(())
    })
}

/// SIGHUP: edge.toml read again; what can change live applied, the rest named.
fn reload(path: &Path, node: &edge_node::Node, level: &LogLevel) {
    let now = match load(path) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %error_chain(&e), "reload refused: edge.toml does not load; the running config stays");
            return;
        }
    };
    if now.log.level != node.config().log.level {
        if rust_log().is_some() {
            tracing::warn!(level = now.log.level, "log.level changed, but RUST_LOG is set and takes precedence");
        } else if let Ok(filter) = parse_log_filter(&now.log.level) {
            // Checked by `load` already; a filter that did not parse never gets here.
            match level.reload(filter) {
                Ok(()) => tracing::info!(level = now.log.level, "log level changed"),
                Err(e) => tracing::error!(error = %e, "log level not changed"),
            }
        }
    }
    match node.reload_from(&now) {
        Ok(waiting) if waiting.is_empty() => {}
        Ok(waiting) => tracing::warn!(keys = waiting.join(", "), "changed in edge.toml; applied at the next restart"),
        Err(e) => tracing::error!(error = %e, "reload failed; keeping the running credentials, ACL and certificates"),
    }
}

fn write_ready_file(path: &Path, node: &edge_node::Node) -> std::io::Result<()> {
    let mqtt: serde_json::Map<String, serde_json::Value> =
        node.mqtt_addrs().iter().map(|(n, a)| (n.clone(), a.to_string().into())).collect();
    let doc = serde_json::json!({
        "pid": std::process::id(),
        "mqtt": mqtt,
        "http": node.http_addr().map(|a| a.to_string()),
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, doc.to_string())?;
    std::fs::rename(tmp, path)
}

fn check_config(path: &Path) -> ExitCode {
    let config = match load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("edge-node: {}", error_chain(&e));
            return ExitCode::from(2);
        }
    };
    // Beyond the file's own checks: can the named files actually be used?
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let mut pair =
        |key: String, cert: &Path, pem_key: &Path, role| match shared::tls::config_check(&key, cert, pem_key, role) {
            Ok(warning) => warnings.extend(warning),
            Err(e) => problems.push(e),
        };
    for (i, l) in config.listeners.iter().enumerate() {
        if let Some(t) = &l.tls {
            pair(format!("listener[{i}].tls"), &t.cert, &t.key, shared::tls::Role::Server);
        }
    }
    if let Some(u) = &config.uplink {
        pair("uplink".into(), &u.cert, &u.key, shared::tls::Role::Client);
    }
    for (i, l) in config.listeners.iter().enumerate() {
        if let Some(t) = &l.tls
            && let Err(e) = edge_node::tls::server_config(t)
        {
            problems.push(format!("listener[{i}].tls: {e}"));
        }
    }
    if let Some(u) = &config.uplink
        && let Err(e) = shared::tls::load_roots(&u.ca)
    {
        problems.push(format!("uplink.ca: {e}"));
    }
    for w in &warnings {
        eprintln!("edge-node: warning: {w}");
    }
    if let Err(e) = edge_node::auth::AuthState::load(&config.auth) {
        problems.push(format!("auth: {e}"));
    }
    if !problems.is_empty() {
        eprintln!(
            "edge-node: config file {} has {} problem(s):\n  {}",
            path.display(),
            problems.len(),
            problems.join("\n  ")
        );
        return ExitCode::from(2);
    }
    match toml::to_string_pretty(&config) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("edge-node: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn spool(command: SpoolCommand) -> anyhow::Result<()> {
    match command {
        SpoolCommand::Stats { config } => {
            let config = load(&config)?;
            let stats = edge_node::spool::inspect::stats(&config.spool.path)?;
            println!("{}", serde_json::to_string_pretty(&stats)?);
        }
        SpoolCommand::Export { config } => {
            let config = load(&config)?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let n = edge_node::spool::inspect::export(&config.spool.path, &mut out)?;
            std::io::Write::flush(&mut out)?;
            eprintln!("exported {n} records");
        }
        SpoolCommand::Backup { config, file } => {
            let config = load(&config)?;
            let copy = edge_node::spool::inspect::backup(&config.spool.path, &file)?;
            let records: u64 = copy.lanes.iter().map(|l| l.messages + l.gap_records).sum();
            println!(
                "backed up {records} records of epoch {} to {} ({} bytes)",
                copy.epoch,
                file.display(),
                copy.database_bytes
            );
        }
        SpoolCommand::Recover { config, file } => {
            let config = load(&config)?;
            let (salvaged, queued) = edge_node::spool::recovery::queue(&file, &config.spool.path)?;
            let unreadable: Vec<_> = salvaged.unreadable.iter().map(|(lane, ranges)| (lane.0, ranges)).collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "file": file,
                    "epoch": salvaged.epoch,
                    "records": salvaged.records,
                    "unreadable": unreadable,
                    "header_repaired": salvaged.header_repaired,
                    "queued": queued,
                }))?
            );
            eprintln!(
                "queued: the node sends it before its own records (within 5 s if it runs), then deletes {}",
                queued.display()
            );
        }
    }
    Ok(())
}

fn models(command: ModelsCommand) -> anyhow::Result<()> {
    let open = |path: &Path| -> anyhow::Result<edge_node::models::Models> {
        let config = load(path)?;
        let m = config.models.with_context(|| format!("{} has no [models] section", path.display()))?;
        let key = std::fs::read(&m.public_key).with_context(|| m.public_key.display().to_string())?;
        Ok(edge_node::models::Models::open(&m.dir, key, m.keep)?)
    };
    match command {
        ModelsCommand::List { config } => {
            let models = open(&config)?;
            let mut out = Vec::new();
            for name in models.names() {
                let current = models.current(&name)?;
                let versions: Vec<String> = models.versions(&name).into_iter().map(|m| m.version).collect();
                out.push(serde_json::json!({ "name": name, "current": current, "versions": versions }));
            }
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        ModelsCommand::Rollback { config, name } => {
            let current = open(&config)?.rollback(&name)?;
            println!("{name}: {} is current ({}, sha256 {})", current.version, current.path.display(), current.sha256);
        }
    }
    Ok(())
}

fn tco_report(path: &Path, json: bool, svg: Option<&Path>) -> anyhow::Result<()> {
    let config = load(path)?;
    let tco = config.tco.clone().with_context(|| format!("{} has no [tco] section", path.display()))?;
    let (snapshot, source) = match config.http.bind.and_then(live_tco) {
        Some(s) => (s, "live, from the running node"),
        None => {
            use edge_node::tco;
            let classes = edge_node::route::Classes::from_config(&config.classes);
            let inputs = tco::inputs(&tco, &classes, &Default::default(), &|_| None);
            let routes = config.classes.iter().map(|c| (c.name.clone(), (c.route, 0))).collect();
            let link = shared::tco::Link { rtt_ms: tco.link.rtt_ms, commit_ms: tco.link.commit_ms };
            (tco::snapshot(&tco, link, &inputs, &routes), "declared traffic from the config")
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&snapshot)?);
    } else {
        println!("TCO report ({source})");
        print!("{}", edge_node::tco::report::table(&snapshot));
    }
    if let Some(file) = svg {
        std::fs::write(file, edge_node::tco::report::svg(&snapshot))
            .with_context(|| format!("cannot write {}", file.display()))?;
    }
    Ok(())
}

/// `/tco` of a node serving on `addr`, if one answers within a second.
fn live_tco(addr: std::net::SocketAddr) -> Option<edge_node::tco::Snapshot> {
    use std::io::Write;
    let addr =
        if addr.ip().is_unspecified() { std::net::SocketAddr::from(([127, 0, 0, 1], addr.port())) } else { addr };
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET /tco HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.lines().next()?.split_whitespace().nth(1)?;
    (status == "200").then(|| serde_json::from_str(body).ok())?
}

fn passwd(file: &Path, user: &str, from_stdin: bool) -> anyhow::Result<()> {
    let password = if from_stdin || !std::io::stdin().is_terminal() {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).context("cannot read the password from stdin")?;
        s.trim_end_matches(['\n', '\r']).to_owned()
    } else {
        let first = rpassword::prompt_password(format!("password for {user}: "))?;
        let second = rpassword::prompt_password("again: ")?;
        anyhow::ensure!(first == second, "the passwords differ");
        first
    };
    anyhow::ensure!(!password.is_empty(), "the password is empty");
    edge_node::auth::PasswordFile::set_password(file, user, password.as_bytes())?;
    println!("{user} set in {}", file.display());
    Ok(())
}
