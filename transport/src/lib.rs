//! Drover's wire protocol. This crate knows nothing about scheduling: it
//! frames and checks the bytes that clients and servers exchange on QUIC
//! streams. The QUIC endpoints themselves arrive with the transport issue.

#![forbid(unsafe_code)]

pub mod frame;
