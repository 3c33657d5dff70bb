//! `cloud-bridge schema register|check|list|show`.

use std::path::PathBuf;

use clap::Subcommand;
use shared::schema::{Compatibility, Kind, Source};

use super::{Registered, RegistryError};
use crate::sink::SchemaStore;

/// Where `register` delivers versions to edges: the model store and the fleet's signing key
/// (`[models]`); none: the config has no `[models]`.
pub struct Delivery {
    pub store: crate::models::Store,
    pub key: shared::model::SigningKey,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs.
        f.debug_struct("Delivery").field("store", &self.store).finish_non_exhaustive()
    }
}

#[derive(Debug, Subcommand)]
pub enum SchemaCommand {
    /// Registers FILE as the next version of SUBJECT if it is compatible with the versions
    /// before it, and delivers it to the edges that bind the subject (with [models]). Exit 1
    /// if it is refused, with the version, field and rule it breaks.
    Register {
        #[command(flatten)]
        schema: SchemaArgs,
        /// Sets the subject's mode: none, backward (the default), forward, full, or one of
        /// these with -transitive.
        #[arg(long)]
        compatibility: Option<Compatibility>,
    },
    /// Says whether FILE could be registered under SUBJECT, and as which version; stores
    /// nothing. Exit 1 if it could not.
    Check {
        #[command(flatten)]
        schema: SchemaArgs,
        /// Checks under this mode instead of the subject's.
        #[arg(long)]
        compatibility: Option<Compatibility>,
    },
    /// Every subject: its kind, versions, newest id and mode.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One version of a subject (the newest unless --version): its id, kind and text.
    Show {
        #[arg(long)]
        subject: String,
        #[arg(long)]
        version: Option<u32>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct SchemaArgs {
    #[arg(long)]
    pub subject: String,
    /// json (JSON Schema), avro, or protobuf (a .proto file).
    #[arg(long)]
    pub kind: Kind,
    /// Protobuf: the message type a payload holds (package.Name); the file's first message
    /// when not given.
    #[arg(long)]
    pub message: Option<String>,
    pub file: PathBuf,
}

impl SchemaArgs {
    fn source(&self) -> anyhow::Result<Source> {
        let text = std::fs::read_to_string(&self.file).map_err(|e| anyhow::anyhow!("{}: {e}", self.file.display()))?;
        Ok(Source { kind: self.kind, text, message: self.message.clone() })
    }
}

impl SchemaCommand {
    /// Whether the command stores versions (and so delivers them).
    pub fn registers(&self) -> bool {
        matches!(self, SchemaCommand::Register { .. })
    }
}

fn mode_name(m: Option<Compatibility>) -> String {
    m.map_or_else(|| format!("{} (default)", Compatibility::default()), |m| m.to_string())
}

/// Runs `command` against `sink`; false: what was asked for was refused (exit 1).
pub async fn run<S: SchemaStore>(
    sink: &S,
    delivery: Option<&Delivery>,
    command: SchemaCommand,
) -> anyhow::Result<bool> {
    match command {
        SchemaCommand::Register { schema, compatibility } => {
            let source = schema.source()?;
            let outcome = match super::register(sink, &schema.subject, source, compatibility).await {
                Ok(o) => o,
                Err(
                    e @ (RegistryError::Incompatible { .. }
                    | RegistryError::KindChanged { .. }
                    | RegistryError::Schema(_)),
                ) => {
                    eprintln!("cloud-bridge: refused: {e}");
                    return Ok(false);
                }
                Err(e) => return Err(e.into()),
            };
            let v = outcome.version();
            match &outcome {
                Registered::New(_) => println!(
                    "registered {} version {} (id {}, {}, compatibility {})",
                    v.subject,
                    v.version,
                    v.id,
                    v.source.kind,
                    mode_name(sink.schema_mode(&v.subject).await?)
                ),
                Registered::Exists(_) => {
                    println!("{} already has this schema as version {} (id {})", v.subject, v.version, v.id)
                }
            }
            deliver(sink, delivery, v).await?;
            Ok(true)
        }
        SchemaCommand::Check { schema, compatibility } => {
            let source = schema.source()?;
            let parsed = match shared::schema::Schema::parse(source) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("cloud-bridge: refused: {e}");
                    return Ok(false);
                }
            };
            match super::check(sink, &schema.subject, &parsed, compatibility).await {
                Ok(Registered::New(v)) => {
                    println!("compatible: would be {} version {} (id {})", v.subject, v.version, v.id);
                    Ok(true)
                }
                Ok(Registered::Exists(v)) => {
                    println!("{} already has this schema as version {} (id {})", v.subject, v.version, v.id);
                    Ok(true)
                }
                Err(e @ (RegistryError::Incompatible { .. } | RegistryError::KindChanged { .. })) => {
                    eprintln!("cloud-bridge: refused: {e}");
                    Ok(false)
                }
                Err(e) => Err(e.into()),
            }
        }
        SchemaCommand::List { json, .. } => {
            let subjects = sink.schema_subjects().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&subjects)?);
            } else {
                println!("{:<24} {:<9} {:>8} {:<17} compatibility", "subject", "kind", "versions", "newest id");
                for s in subjects {
                    println!(
                        "{:<24} {:<9} {:>8} {:<17} {}",
                        s.subject,
                        s.latest.source.kind,
                        s.versions,
                        s.latest.id,
                        mode_name(s.compatibility)
                    );
                }
            }
            Ok(true)
        }
        SchemaCommand::Show { subject, version, json, .. } => {
            let v = super::show(sink, &subject, version).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let message = v.source.message.as_deref().map(|m| format!(", message {m}")).unwrap_or_default();
                println!("{} version {} (id {}, {}{message})", v.subject, v.version, v.id, v.source.kind);
                println!("{}", v.source.text.trim_end());
            }
            Ok(true)
        }
    }
}

/// Delivers `v` to the edges through the model store, when there is one.
async fn deliver<S: SchemaStore>(
    sink: &S,
    delivery: Option<&Delivery>,
    v: &shared::schema::Version,
) -> anyhow::Result<()> {
    let Some(d) = delivery else {
        println!("not delivered to edges: the config has no [models] section (schemas travel as signed models)");
        return Ok(());
    };
    let scratch = tempfile::tempdir()?;
    let name = shared::model::schema_model(&v.subject);
    let staging = super::staging(sink, v).await?;
    if !staging.writers.is_empty() {
        let writers: Vec<String> = staging.writers.iter().map(|w| w.version.to_string()).collect();
        println!("edges also accept what producers on version {} still write", writers.join(", "));
    }
    match super::deliver(&d.store, &d.key, &staging, scratch.path()).await? {
        Some(p) => println!("delivered to edges as model {name} version {} (signed by {})", p.version, p.key_id),
        None => println!("model {name} version {} is already in the model store", v.version),
    }
    Ok(())
}
