//! `drover tls ca create` and `drover tls cert create`: the cluster's CA and
//! the certificates of its servers, agents and operators, as Nomad's
//! `nomad tls` makes them.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;
use transport::tls::Role;

#[derive(Debug, Subcommand)]
pub enum TlsCommand {
    /// Makes the cluster CA.
    Ca {
        #[command(subcommand)]
        command: TlsCaCommand,
    },
    /// Makes a certificate signed by the cluster CA.
    Cert {
        #[command(subcommand)]
        command: TlsCertCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum TlsCaCommand {
    /// Writes drover-agent-ca.pem and drover-agent-ca-key.pem.
    Create {
        /// Where to write.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum TlsCertCommand {
    /// Writes global-{server,client,cli}-drover.pem and its key.
    Create {
        /// A server certificate.
        #[arg(long, conflicts_with_all = ["client", "cli"], required_unless_present_any = ["client", "cli"])]
        server: bool,
        /// A client (agent) certificate.
        #[arg(long, conflicts_with = "cli")]
        client: bool,
        /// An operator certificate: a client certificate that may also
        /// register jobs and read the cluster report (loadgen --server).
        #[arg(long)]
        cli: bool,
        /// The CA certificate.
        #[arg(long, default_value = "drover-agent-ca.pem")]
        ca: PathBuf,
        /// The CA key.
        #[arg(long, default_value = "drover-agent-ca-key.pem")]
        key: PathBuf,
        /// Extra DNS names or IP addresses for the certificate.
        #[arg(long = "additional-dnsname")]
        names: Vec<String>,
        /// Where to write.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
}

/// Runs `drover tls ...`: writes the files and names them.
pub fn command(command: TlsCommand) -> Result<()> {
    let written = match command {
        TlsCommand::Ca { command: TlsCaCommand::Create { dir } } => crate::tls_files::create_ca(&dir)?,
        TlsCommand::Cert { command: TlsCertCommand::Create { server, client: _, cli, ca, key, names, dir } } => {
            let role = match (server, cli) {
                (true, _) => Role::Server,
                (false, true) => Role::Operator,
                (false, false) => Role::Client,
            };
            crate::tls_files::create_cert(&dir, role, &ca, &key, &names)?
        }
    };
    for path in written {
        println!("==> Created {}", path.display());
    }
    Ok(())
}
