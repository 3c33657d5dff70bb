//! cloud-bridge: terminates the edges' QUIC bridges and writes into the central cluster.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cloud_bridge::Bridge;
use cloud_bridge::config::CloudConfig;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(version, about = "Cloud side of the edge-to-cloud bridge (QUIC ehb/1, exactly once into the sink)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve edges until SIGINT or SIGTERM.
    Run {
        #[arg(long, default_value_os_t = default_config())]
        config: PathBuf,
        /// Write {"quic": addr, "http": addr} here once listening (for scripts and tests).
        #[arg(long)]
        ready_file: Option<PathBuf>,
    },
    /// Load and check a config (and the certificate files it names); print every problem.
    CheckConfig {
        #[arg(long, default_value_os_t = default_config())]
        config: PathBuf,
    },
    /// Development certificates.
    Certs {
        #[command(subcommand)]
        command: CertsCommand,
    },
    /// Model versions for the edges: publish, list, remove; the signing key.
    Model {
        #[command(subcommand)]
        command: ModelCommand,
    },
    /// The fleet's TCO view: every edge's latest classes report, summed per class.
    Tco {
        #[command(subcommand)]
        command: TcoCommand,
    },
    /// What reached the sink: the last records, counts per edge.
    Records {
        #[command(subcommand)]
        command: RecordsCommand,
    },
    /// Records the JetStream or Kafka sink refused for themselves and set aside: list, replay.
    DeadLetters {
        #[command(subcommand)]
        command: DeadLettersCommand,
    },
    /// The fleet view: every edge's bridge, backlog and routes, across all bridges on the sink.
    Edges {
        #[command(subcommand)]
        command: EdgesCommand,
    },
    /// Stores a message for a local MQTT topic of one edge, a group or every edge; each edge's
    /// bridge delivers it once the edge is connected. Exit 1 if any edge's backlog refused it.
    Send(Box<SendArgs>),
    /// The schema registry: register and check versions of a subject, list, show.
    Schema {
        #[arg(long, global = true, default_value_os_t = default_config())]
        config: PathBuf,
        #[command(subcommand)]
        command: cloud_bridge::schemas::cli::SchemaCommand,
    },
    /// Messages to edges: an edge's position and backlog, what edges refused.
    Downlink {
        #[command(subcommand)]
        command: DownlinkCommand,
    },
}

#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("target").required(true).args(["edge", "group", "all", "lines"]))]
#[command(group = clap::ArgGroup::new("body").required(true).args(["payload", "file", "lines"]))]
struct SendArgs {
    #[arg(long, default_value_os_t = default_config())]
    config: PathBuf,
    /// One edge, by id: one the fleet view has seen or with downlink messages, unless
    /// `--new-edge`.
    #[arg(long)]
    edge: Option<String>,
    /// `--edge` may be an edge that has not connected yet.
    #[arg(long, requires = "edge")]
    new_edge: bool,
    /// Your id for this message (1 to 128 of `A-Za-z0-9._:-`): a send again with the same id
    /// to the same edge, within a day and its last 128 ids, stores nothing more and says so
    /// (after a timeout, run the command again as it was).
    #[arg(long)]
    id: Option<String>,
    /// Each edge of a group of `downlink.groups`.
    #[arg(long)]
    group: Option<String>,
    /// Every edge the fleet view knows.
    #[arg(long)]
    all: bool,
    /// The local MQTT topic.
    #[arg(long, required_unless_present = "lines")]
    topic: Option<String>,
    #[arg(long, default_value_t = 1)]
    qos: u8,
    #[arg(long)]
    retain: bool,
    /// Not delivered after this long (`30s`, `1h`); the local message's expiry carries what is
    /// left.
    #[arg(long)]
    expiry: Option<shared::units::HumanDuration>,
    /// `name=value`, repeatable.
    #[arg(long = "user-property")]
    user_properties: Vec<String>,
    #[arg(long)]
    response_topic: Option<String>,
    #[arg(long)]
    correlation_data: Option<String>,
    #[arg(long)]
    content_type: Option<String>,
    #[arg(long)]
    payload: Option<String>,
    /// The payload, from a file.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Many messages, from a file (`-`: standard input) of JSON lines, each its own message
    /// with its target: the keys are these flags with `_` for `-` (`edges` a list;
    /// `payload_base64` for bytes; `user_properties` a list of `[name, value]`), e.g.
    /// `{"edge": "edge-1", "topic": "cmd/a", "payload": "1", "id": "a-1"}`. Every line is
    /// checked before any is stored; each edge's are stored in line order. One line per edge
    /// is printed.
    #[arg(long, conflicts_with_all = [
        "topic", "qos", "retain", "expiry", "user_properties", "response_topic", "correlation_data",
        "content_type", "id", "new_edge", "wait",
    ])]
    lines: Option<PathBuf>,
    /// Waits this long for a local app's reply (to `--response-topic`, or one made up, with
    /// the correlation data) and prints it; exit 1 without one. Only with `--edge`.
    #[arg(long, requires = "edge")]
    wait: Option<shared::units::HumanDuration>,
}

#[derive(Subcommand)]
enum DownlinkCommand {
    /// One edge's position, what it did with its messages, and what waits for it.
    Status {
        #[arg(long, default_value_os_t = default_config())]
        config: PathBuf,
        #[arg(long)]
        edge: String,
        #[arg(long)]
        json: bool,
    },
    /// Messages edges refused or let expire (the downlink's dead letters), oldest first.
    Refused {
        #[arg(long, default_value_os_t = default_config())]
        config: PathBuf,
        #[arg(long)]
        edge: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum RecordsCommand {
    /// The last records stored (of one edge), oldest first: edge, epoch:lane:seq, kind, topic,
    /// size and payload.
    Tail {
        #[arg(long, default_value_os_t = default_config())]
        config: PathBuf,
        /// Only this edge's records.
        #[arg(long)]
        edge: Option<String>,
        /// How many.
        #[arg(short = 'n', long, default_value_t = 10)]
        count: usize,
        /// JSON (with every header) instead of a line each.
        #[arg(long)]
        json: bool,
    },
    /// Records stored per edge.
    Count {
        #[arg(long, default_value_os_t = default_config())]
        config: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum DeadLettersCommand {
    /// Records JetStream refused for themselves (too large for the server, a header the stream
    /// refuses), set aside with the reason: their stream sequence, reason, subject and record.
    List {
        #[arg(long, default_value_os_t = default_config())]
        config: PathBuf,
        #[arg(long)]
        edge: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Publishes dead letters again on their subjects (after raising the limit that refused
    /// them) and deletes each once JetStream acked it; on Kafka, produces each to its topic
    /// with a note that it was replayed, in one transaction.
    Replay {
        #[arg(long, default_value_os_t = default_config())]
        config: PathBuf,
        /// Their sequences (`dead-letters list`).
        #[arg(required_unless_present = "all")]
        seqs: Vec<u64>,
        /// Every dead letter.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Subcommand)]
enum EdgesCommand {
    /// One line per edge: status (connected, lost, disconnected), bridge, protocol version,
    /// last seen, backlog, oldest unacked record, drops and gaps, routes per class.
    List {
        #[arg(long, default_value_os_t = default_config())]
        config: PathBuf,
        /// JSON (the same document as `GET /edges`) instead of the table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ModelCommand {
    /// Chunk FILE, store the chunks the store lacks, sign the manifest and store it.
    Publish {
        #[arg(long, default_value_os_t = default_config())]
        config: PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long)]
        version: String,
        file: PathBuf,
    },
    /// Every published version.
    List {
        #[arg(long, default_value_os_t = default_config())]
        config: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Remove a version, and the chunks no other version uses.
    Rm {
        #[arg(long, default_value_os_t = default_config())]
        config: PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long)]
        version: String,
    },
    /// Write a new ed25519 model signing key (model-signing.pk8) and its public half
    /// (model-signing.pub, for the edges) into DIR.
    Keygen {
        #[arg(long)]
        dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum TcoCommand {
    /// Per class across the fleet: edges, traffic, each route's monthly cost, the routes the
    /// edges have now and the ones their models chose.
    Report {
        #[arg(long, default_value_os_t = default_config())]
        config: PathBuf,
        /// JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum CertsCommand {
    /// Write a fleet CA, the bridge's server certificate and one client certificate per edge.
    Init {
        #[arg(long)]
        dir: PathBuf,
        /// Edge ids (each becomes its certificate's DNS name). Repeatable.
        #[arg(long = "edge")]
        edges: Vec<String>,
        /// Names the bridge is reached by (localhost and 127.0.0.1 are always included).
        #[arg(long = "server-name")]
        server_names: Vec<String>,
        /// Replace an existing PKI in `dir`.
        #[arg(long)]
        force: bool,
    },
    /// Issue one more edge certificate from the CA `init` wrote in `dir` (`fleet-ca.key`).
    AddEdge {
        #[arg(long)]
        dir: PathBuf,
        /// The edge id (its certificate's DNS name).
        id: String,
    },
}

/// The config file a command reads without `--config`: `$CLOUD_BRIDGE_CONFIG`, else the packaged
/// `/etc/cloud-bridge/cloud.toml` where it exists, else `config/cloud.toml` (a checkout).
fn default_config() -> PathBuf {
    shared::units::default_config("CLOUD_BRIDGE_CONFIG", "/etc/cloud-bridge/cloud.toml", "config/cloud.toml")
}

fn main() -> ExitCode {
    let done = |r: anyhow::Result<()>| r.map(|()| true);
    let outcome = match Cli::parse().command {
        Command::Run { config, ready_file } => return run(&config, ready_file),
        Command::CheckConfig { config } => return check_config(&config),
        Command::Model { command } => done(model(command)),
        Command::Tco { command: TcoCommand::Report { config, json } } => done(tco_report(&config, json)),
        Command::Records { command } => done(records(command)),
        Command::DeadLetters { command } => done(dead_letters(command)),
        Command::Schema { config, command } => schema(&config, command),
        Command::Send(args) => send(*args),
        Command::Downlink { command } => done(downlink(command)),
        Command::Edges { command: EdgesCommand::List { config, json } } => done(edges_list(&config, json)),
        Command::Certs { command: CertsCommand::Init { dir, edges, server_names, force } } => {
            done(cloud_bridge::certs::init(&dir, &server_names, &edges, force).map_err(Into::into).map(|pki| {
                println!("fleet CA: {}", pki.ca.display());
                println!("bridge:   {} {}", pki.server_cert.display(), pki.server_key.display());
                for (id, cert, key) in pki.edges {
                    println!("edge {id}: {} {}", cert.display(), key.display());
                }
            }))
        }
        Command::Certs { command: CertsCommand::AddEdge { dir, id } } => {
            done(cloud_bridge::certs::add_edge(&dir, &id).map_err(Into::into).map(|(cert, key)| {
                println!("edge {id}: {} {}", cert.display(), key.display());
            }))
        }
    };
    exit(outcome)
}

/// A command's exit status: 0 when it did what it was asked, 1 when it ran and the answer is
/// no (a schema incompatible, a send not stored, no reply), 2 with the error that stopped it.
fn exit(outcome: anyhow::Result<bool>) -> ExitCode {
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("cloud-bridge: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Loads the config and every certificate and key it names: the file's problems, a key that
/// is not its certificate's, a client certificate where the server's belongs, an expired one
/// (exit 2); certificates expiring within 30 days are named (exit 0).
fn check_config(path: &std::path::Path) -> ExitCode {
    let config = match CloudConfig::load(path) {
        Ok(c) => c,
        Err(cloud_bridge::config::ConfigError::Invalid { problems, .. }) => {
            return listed(path, problems.iter().map(ToString::to_string).collect());
        }
        Err(e) => {
            eprintln!("cloud-bridge: {e}");
            return ExitCode::from(2);
        }
    };
    let s = &config.server;
    let mut problems = Vec::new();
    match shared::tls::config_check("server", &s.cert, &s.key, shared::tls::Role::Server) {
        Ok(Some(warning)) => eprintln!("cloud-bridge: warning: {warning}"),
        Ok(None) => {}
        Err(e) => problems.push(e),
    }
    if let Err(e) = shared::tls::load_roots(&s.client_ca) {
        problems.push(format!("server.client_ca: {e}"));
    }
    listed(path, problems)
}

/// `ok`, or every problem on its own line (exit 2).
fn listed(path: &std::path::Path, problems: Vec<String>) -> ExitCode {
    if problems.is_empty() {
        println!("{}: ok", path.display());
        return ExitCode::SUCCESS;
    }
    eprintln!(
        "cloud-bridge: config file {} has {} problem(s):\n  {}",
        path.display(),
        problems.len(),
        problems.join("\n  ")
    );
    ExitCode::from(2)
}

fn run(path: &std::path::Path, ready_file: Option<PathBuf>) -> ExitCode {
    let config = match CloudConfig::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cloud-bridge: {e}");
            return ExitCode::from(2);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&config.log.level));
    // Colour codes only where a person reads them: not in journald or a log file.
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match config.log.format {
        cloud_bridge::config::LogFormat::Json => fmt.json().init(),
        cloud_bridge::config::LogFormat::Text => fmt.init(),
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cloud-bridge: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let bridge = match Bridge::start(config).await {
            Ok(b) => b,
            Err(e) => {
                eprintln!("cloud-bridge: {e}");
                return ExitCode::FAILURE;
            }
        };
        if let Some(file) = ready_file {
            let ready = serde_json::json!({
                "quic": bridge.quic_addr().to_string(),
                "http": bridge.http_addr().map(|a| a.to_string()),
            });
            if let Err(e) = std::fs::write(&file, ready.to_string()) {
                eprintln!("cloud-bridge: cannot write {}: {e}", file.display());
                return ExitCode::FAILURE;
            }
        }
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("cloud-bridge: cannot watch SIGTERM: {e}");
                return ExitCode::FAILURE;
            }
        };
        // SIGHUP reloads the certificates and the deny list; without a handler it killed the
        // bridge, and the unit's Restart=on-failure left it down.
        let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("cloud-bridge: cannot watch SIGHUP: {e}");
                return ExitCode::FAILURE;
            }
        };
        shared::service::tell("READY=1\nSTATUS=serving edges");
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
                _ = hup.recv() => match CloudConfig::load(path).map_err(|e| e.to_string()).and_then(|c| bridge.reload(&c).map_err(|e| e.to_string())) {
                    Ok(ended) => tracing::info!(ended = ended.join(","), "reloaded the certificates, the fleet CA and server.deny_serials; sessions of denied certificates closed"),
                    Err(e) => tracing::error!(error = %e, "reload refused; the running certificates and deny list stay"),
                },
            }
        }
        tracing::info!("shutting down");
        shared::service::tell("STOPPING=1");
        if tokio::time::timeout(std::time::Duration::from_secs(5), bridge.stop()).await.is_err() {
            tracing::warn!("sessions still open after 5 s; exiting anyway");
        }
        ExitCode::SUCCESS
    })
}

fn send(args: SendArgs) -> anyhow::Result<bool> {
    use cloud_bridge::downlink::send::{self, Flags, Target};
    let config = CloudConfig::load(&args.config)?;
    if let Some(path) = &args.lines {
        return send_lines(&config, path);
    }
    let payload = match (&args.payload, &args.file) {
        (Some(p), _) => p.clone().into_bytes(),
        (None, Some(f)) => std::fs::read(f).map_err(|e| anyhow::anyhow!("--file {}: {e}", f.display()))?,
        (None, None) => unreachable!("clap requires one"),
    };
    let mut msg = send::message(Flags {
        topic: args.topic.unwrap_or_default(),
        qos: args.qos,
        retain: args.retain,
        expiry: args.expiry.map(|d| d.0),
        user_properties: args.user_properties,
        response_topic: args.response_topic,
        correlation_data: args.correlation_data,
        content_type: args.content_type,
        payload,
        id: args.id,
    })?;
    let request = match (&args.wait, &args.edge) {
        (Some(wait), Some(edge)) => Some((send::as_request(edge, &mut msg)?, wait.0)),
        _ => None,
    };
    let target = match (args.edge, args.group) {
        (Some(e), _) if args.new_edge => Target::NewEdge(e),
        (Some(e), _) => Target::Edge(e),
        (None, Some(g)) => Target::Group(g),
        (None, None) => Target::All,
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        use cloud_bridge::sink::DownlinkStore;
        let sink = config.sink.open_for_command().await?;
        let cursor = match request {
            Some(_) => sink.reply_cursor().await?,
            None => 0,
        };
        let edges = send::edges(&sink, &config.downlink, &target).await?;
        let sent = send::send(&sink, &config.downlink, &edges, &msg).await?;
        let mut all = true;
        for (edge, what) in &sent {
            println!("{}", send::describe(&config.downlink, &msg.topic, edge, what));
            all &= matches!(
                what,
                cloud_bridge::sink::downlink::Enqueued::Stored { .. }
                    | cloud_bridge::sink::downlink::Enqueued::Already { .. }
            );
        }
        if let (true, Some(((topic, correlation), wait)), [edge]) = (all, &request, &edges[..]) {
            match send::wait_reply(&sink, edge, (topic, correlation), cursor, *wait).await? {
                Some(reply) => {
                    println!("reply from {edge} on {topic}: {}", String::from_utf8_lossy(&reply.payload))
                }
                None => {
                    eprintln!(
                        "cloud-bridge: no reply from {edge} on {topic} within {}",
                        shared::units::HumanDuration(*wait)
                    );
                    all = false;
                }
            }
        }
        Ok(all)
    })
}

/// `send --lines`: see `cloud_bridge::downlink::lines`.
fn send_lines(config: &CloudConfig, path: &std::path::Path) -> anyhow::Result<bool> {
    use cloud_bridge::downlink::lines;
    let parsed = match path.as_os_str() == "-" {
        true => lines::parse(std::io::stdin().lock()),
        false => {
            let file = std::fs::File::open(path).map_err(|e| anyhow::anyhow!("--lines {}: {e}", path.display()))?;
            lines::parse(std::io::BufReader::new(file))
        }
    }
    .map_err(|e| anyhow::anyhow!("--lines {}: {e}; nothing was stored", path.display()))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let sink = config.sink.open_for_command().await?;
        let outcomes = lines::send(&sink, &config.downlink, &parsed)
            .await
            .map_err(|e| anyhow::anyhow!("--lines {}: {e}; nothing was stored", path.display()))?;
        let mut all = true;
        for o in &outcomes {
            println!("{}", o.describe(&config.downlink));
            all &= o.all_stored();
        }
        Ok(all)
    })
}

fn schema(config: &std::path::Path, command: cloud_bridge::schemas::cli::SchemaCommand) -> anyhow::Result<bool> {
    let config = CloudConfig::load(config)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let delivery = match (&config.models, command.registers()) {
            (Some(models), true) => Some(cloud_bridge::schemas::cli::Delivery {
                store: cloud_bridge::models::open(Some(models), config.sink.nats_url()).await?,
                key: cloud_bridge::models::signing_key(&models.signing_key)?,
            }),
            _ => None,
        };
        let sink = config.sink.open_for_command().await?;
        cloud_bridge::schemas::cli::run(&sink, delivery.as_ref(), command).await
    })
}

fn downlink(command: DownlinkCommand) -> anyhow::Result<()> {
    use cloud_bridge::sink::DownlinkStore;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match command {
        DownlinkCommand::Status { config, edge, json } => {
            let config = CloudConfig::load(&config)?;
            runtime.block_on(async {
                let sink = config.sink.open_for_command().await?;
                let state = sink.down_state(&edge).await?;
                let backlog = sink.down_backlog(&edge).await?;
                if json {
                    println!("{}", serde_json::json!({ "edge": edge, "state": state, "backlog": backlog }));
                } else {
                    let oldest = backlog
                        .oldest_ms
                        .map(|t| format!(", oldest {} s old", shared::units::now_ms().saturating_sub(t) / 1000))
                        .unwrap_or_default();
                    println!(
                        "{edge}: position {}, delivered {}, refused {}, expired {}; waiting {} messages, {} bytes{oldest}",
                        state.position, state.delivered, state.refused, state.expired, backlog.messages, backlog.bytes
                    );
                }
                Ok(())
            })
        }
        DownlinkCommand::Refused { config, edge, limit, json } => {
            let config = CloudConfig::load(&config)?;
            runtime.block_on(async {
                let sink = config.sink.open_for_command().await?;
                let dead = sink.down_dead_letters(edge.as_deref(), limit).await?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&dead)?);
                } else {
                    for d in &dead {
                        println!("{} {} {} {} ({} bytes): {}", d.edge, d.seq, d.outcome, d.topic, d.bytes, d.reason);
                    }
                    println!("{} downlink dead letters", dead.len());
                }
                Ok(())
            })
        }
    }
}

fn tco_report(path: &std::path::Path, json: bool) -> anyhow::Result<()> {
    let config = CloudConfig::load(path)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let reports = runtime.block_on(config.sink.load_reports())?;
    let fleet = cloud_bridge::tco::fleet(&reports);
    if json {
        println!("{}", serde_json::to_string_pretty(&fleet)?);
    } else {
        print!("{}", cloud_bridge::tco::table(&fleet));
    }
    Ok(())
}

fn records(command: RecordsCommand) -> anyhow::Result<()> {
    use cloud_bridge::sink::inspect;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match command {
        RecordsCommand::Tail { config, edge, count, json } => {
            let config = CloudConfig::load(&config)?;
            let seen = runtime.block_on(inspect::tail(&config.sink, edge.as_deref(), count))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&seen)?);
            } else {
                seen.iter().for_each(|r| println!("{}", r.line()));
            }
        }
        RecordsCommand::Count { config, json } => {
            let config = CloudConfig::load(&config)?;
            let counts = runtime.block_on(inspect::count(&config.sink))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&counts)?);
            } else {
                counts.iter().for_each(|(edge, n)| println!("{edge} {n}"));
                println!("total {}", counts.values().sum::<u64>());
            }
        }
    }
    Ok(())
}

fn dead_letters(command: DeadLettersCommand) -> anyhow::Result<()> {
    use cloud_bridge::sink::inspect;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match command {
        DeadLettersCommand::List { config, edge, json } => {
            let config = CloudConfig::load(&config)?;
            if config.sink.nats_url().is_none() {
                println!("the SQLite sink stores every record: it has no dead letters");
                return Ok(());
            }
            let letters = runtime.block_on(inspect::dead_letters(&config.sink, edge.as_deref()))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&letters)?);
            } else {
                for d in &letters {
                    let kept = if d.whole { "kept whole" } else { "ids only" };
                    println!("{} {} {kept} {}: {}", d.seq, d.reason, d.record.line(), d.error);
                }
                println!("{} dead letters", letters.len());
            }
        }
        DeadLettersCommand::Replay { config, seqs, all } => {
            let config = CloudConfig::load(&config)?;
            let seqs = if all {
                runtime.block_on(inspect::dead_letters(&config.sink, None))?.into_iter().map(|d| d.seq).collect()
            } else {
                seqs
            };
            let mut failed = 0;
            for (seq, outcome) in runtime.block_on(inspect::replay(&config.sink, &seqs))? {
                match outcome {
                    Ok(subject) => println!("{seq}: published again on {subject}; dead letter deleted"),
                    Err(e) => {
                        failed += 1;
                        eprintln!("{seq}: {e}");
                    }
                }
            }
            anyhow::ensure!(failed == 0, "{failed} dead letters not replayed (they stay)");
        }
    }
    Ok(())
}

fn edges_list(path: &std::path::Path, json: bool) -> anyhow::Result<()> {
    let config = CloudConfig::load(path)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let data = runtime.block_on(config.sink.load_fleet())?;
    let view = cloud_bridge::fleet::view::of(data);
    if json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", cloud_bridge::fleet::view::table(&view));
    }
    Ok(())
}

fn model(command: ModelCommand) -> anyhow::Result<()> {
    use cloud_bridge::models::{ModelStore, Store};
    use std::io::IsTerminal;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let open = |config: &std::path::Path| -> anyhow::Result<(Store, cloud_bridge::config::ModelsConfig)> {
        let config = CloudConfig::load(config)?;
        let store = runtime.block_on(cloud_bridge::models::open(config.models.as_ref(), config.sink.nats_url()))?;
        let models = config.models.ok_or_else(|| anyhow::anyhow!("the config has no [models] section"))?;
        Ok((store, models))
    };
    match command {
        ModelCommand::Keygen { dir } => {
            let (private, public, id) = cloud_bridge::models::keygen(&dir)?;
            println!(
                "signing key {id}: {} (keep it secret), public key for the edges: {}",
                private.display(),
                public.display()
            );
        }
        ModelCommand::Publish { config, name, version, file } => {
            if name.starts_with(shared::model::SCHEMA_PREFIX) {
                anyhow::bail!(
                    "model {name}: names starting with {:?} carry the schema registry's versions; use `cloud-bridge schema register`",
                    shared::model::SCHEMA_PREFIX
                );
            }
            let (store, models) = open(&config)?;
            let key = cloud_bridge::models::signing_key(&models.signing_key)?;
            let total = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0).max(1);
            let tty = std::io::stderr().is_terminal();
            let started = std::time::Instant::now();
            let p = runtime.block_on(cloud_bridge::models::publish(&store, &key, &name, &version, &file, |done| {
                if tty {
                    let width = 30 * done / total;
                    eprint!(
                        "\r{name} {version} [{}{}] {:.1}/{:.1} MiB",
                        "#".repeat(width as usize),
                        " ".repeat(30 - width as usize),
                        done as f64 / 1048576.0,
                        total as f64 / 1048576.0
                    );
                }
            }))?;
            if tty {
                eprintln!();
            }
            println!(
                "published {} {}: {} bytes in {} chunks, {} new ({} bytes), signed by {}, in {:.1} s",
                p.name,
                p.version,
                p.size,
                p.chunks,
                p.new_chunks,
                p.new_bytes,
                p.key_id,
                started.elapsed().as_secs_f64()
            );
        }
        ModelCommand::List { config, json } => {
            let (store, _) = open(&config)?;
            let list = runtime.block_on(store.list())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!("{:<24} {:<16} {:>14} {:>7}", "name", "version", "bytes", "chunks");
                for m in list {
                    println!("{:<24} {:<16} {:>14} {:>7}", m.name, m.version, m.size, m.chunks);
                }
            }
        }
        ModelCommand::Rm { config, name, version } => {
            let (store, _) = open(&config)?;
            let removed = runtime.block_on(store.remove(&name, &version))?;
            println!("removed {name} {version} and {removed} chunks no other version uses");
        }
    }
    Ok(())
}
