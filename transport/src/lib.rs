//! Drover's client↔server protocol over QUIC. The bytes on a stream are
//! [`frame::Frame`]s; what a frame carries is a [`message::Message`];
//! [`tls`] makes and loads the cluster's certificates; [`settings`] holds
//! the QUIC settings for 10,000 connections and why; [`server`] is the
//! server's client-facing endpoint over the engine's node endpoint, and
//! [`client`] what agents and loadgen connect with (their calls share one
//! long-lived stream, `calls`); [`agent_call`] is how a server calls an
//! agent back on the agent's connection.

#![forbid(unsafe_code)]

pub mod agent_call;
mod calls;
pub mod client;
pub mod frame;
pub mod log_limit;
pub mod message;
pub mod peer;
pub mod server;
pub mod settings;
pub mod stream;
pub mod tls;

/// Installs aws-lc-rs as the process's rustls crypto provider (the only
/// one compiled in; see [`tls`]). Idempotent.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
