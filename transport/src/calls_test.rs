//! The call stream against a scripted QUIC server on loopback: real
//! connections with the cluster's TLS, a server that counts the streams it
//! is given and answers as each test tells it.

use std::net::SocketAddr;
use std::time::Duration;

use quinn::Endpoint;
use tokio::sync::mpsc;

use super::CallStream;
use crate::frame::{Frame, MAX_PAYLOAD};
use crate::settings;
use crate::stream::FrameReader;
use crate::tls::{TlsMaterial, SERVER_NAME};

/// A hang becomes a failure after this long; nothing here is timed.
const WATCHDOG: Duration = Duration::from_secs(60);

async fn bounded<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WATCHDOG, future).await.unwrap_or_else(|_| panic!("{what} did not happen within {WATCHDOG:?}"))
}

/// How the scripted server answers a stream.
#[derive(Clone, Copy)]
enum Script {
    /// Every frame, with its payload reversed, in batches of `batch`
    /// frames answered last first (answers out of order).
    Reversed { batch: usize },
    /// The first frame of every stream, then the stream is finished (a
    /// server of an earlier build).
    OnePerStream,
    /// Nothing on the first stream (reported on `held`); the rest like
    /// `Reversed { batch: 1 }`.
    HoldFirst,
}

struct Scripted {
    addr: SocketAddr,
    /// One message per stream accepted, with its number (from 1).
    streams: mpsc::UnboundedReceiver<usize>,
    /// The request ids of frames the server holds without answering.
    held: mpsc::UnboundedReceiver<u64>,
    client_tls: TlsMaterial,
}

fn start(script: Script) -> Scripted {
    crate::install_crypto_provider();
    let (_ca, server_tls, client_tls) = TlsMaterial::dev_pair().expect("dev material");
    let config = settings::server_config(server_tls.server_crypto().expect("server crypto"));
    let endpoint = Endpoint::server(config, "127.0.0.1:0".parse().expect("address")).expect("binds");
    let addr = endpoint.local_addr().expect("bound");
    let (streams_tx, streams) = mpsc::unbounded_channel();
    let (held_tx, held) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let _endpoint_lives = &endpoint;
        let connection = endpoint.accept().await.expect("a client").await.expect("handshake");
        let mut count = 0;
        while let Ok((mut send, mut recv)) = connection.accept_bi().await {
            count += 1;
            streams_tx.send(count).expect("test alive");
            let held_tx = held_tx.clone();
            tokio::spawn(async move {
                let mut reader = FrameReader::new(MAX_PAYLOAD);
                let mut pending = Vec::new();
                while let Ok(Some(frame)) = reader.next(&mut recv).await {
                    let batch = match script {
                        Script::Reversed { batch } => batch,
                        Script::OnePerStream => 1,
                        Script::HoldFirst if count == 1 => {
                            held_tx.send(frame.request_id).expect("test alive");
                            continue;
                        }
                        Script::HoldFirst => 1,
                    };
                    pending.push(frame);
                    if pending.len() < batch {
                        continue;
                    }
                    let mut out = Vec::new();
                    for frame in pending.drain(..).rev() {
                        let payload = frame.payload.iter().rev().copied().collect();
                        Frame { payload, ..frame }.encode(&mut out).expect("encodes");
                    }
                    send.write_all(&out).await.expect("answers");
                    if matches!(script, Script::OnePerStream) {
                        let _ = send.finish();
                        return;
                    }
                }
            });
        }
    });
    Scripted { addr, streams, held, client_tls }
}

async fn connect(scripted: &Scripted) -> quinn::Connection {
    let mut endpoint = Endpoint::client("127.0.0.1:0".parse().expect("address")).expect("client endpoint");
    endpoint.set_default_client_config(settings::client_config(
        scripted.client_tls.client_crypto(2).expect("client crypto"),
    ));
    bounded("connect", endpoint.connect(scripted.addr, SERVER_NAME).expect("connects")).await.expect("handshake")
}

fn frame(request_id: u64) -> Frame {
    Frame { kind: 2, request_id, payload: request_id.to_be_bytes().to_vec() }
}

fn answer_of(request_id: u64) -> Vec<u8> {
    request_id.to_be_bytes().iter().rev().copied().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_share_one_stream_and_each_caller_gets_its_own_answer() {
    let mut scripted = start(Script::Reversed { batch: 10 });
    let calls = std::sync::Arc::new(CallStream::new(connect(&scripted).await));
    let mut answers = tokio::task::JoinSet::new();
    for request_id in 1..=100u64 {
        let calls = calls.clone();
        answers.spawn(async move { (request_id, calls.call(&frame(request_id)).await) });
    }
    let mut answered = 0;
    while let Some(joined) = bounded("the answers", answers.join_next()).await {
        let (request_id, answer) = joined.expect("the call ran");
        let answer = answer.expect("answered");
        assert_eq!(answer.request_id, request_id);
        assert_eq!(answer.payload, answer_of(request_id), "the answer to its own request");
        answered += 1;
    }
    assert_eq!(answered, 100);
    assert_eq!(scripted.streams.recv().await, Some(1));
    assert!(scripted.streams.try_recv().is_err(), "one stream carried every call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_gives_up_abandons_the_stream_and_the_next_call_opens_another() {
    let mut scripted = start(Script::HoldFirst);
    let calls = std::sync::Arc::new(CallStream::new(connect(&scripted).await));
    let held = tokio::spawn({
        let calls = calls.clone();
        async move { calls.call(&frame(1)).await }
    });
    assert_eq!(bounded("the held frame", scripted.held.recv()).await, Some(1));
    // The caller gives up (as a timeout would drop its future).
    held.abort();
    assert!(held.await.expect_err("aborted").is_cancelled());

    let answer = bounded("the next call", calls.call(&frame(2))).await.expect("answered");
    assert_eq!(answer.payload, answer_of(2));
    assert_eq!(scripted.streams.recv().await, Some(1));
    assert_eq!(scripted.streams.recv().await, Some(2), "the next call went on a new stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_answering_one_call_per_stream_answers_every_call() {
    let mut scripted = start(Script::OnePerStream);
    let calls = CallStream::new(connect(&scripted).await);
    for request_id in 1..=3u64 {
        // The stream the last answer came on may not have been seen to end
        // yet: a call sent on it is answered by none and may be retried.
        let answer = loop {
            match bounded("a call", calls.call(&frame(request_id))).await {
                Ok(answer) => break answer,
                Err(error) if error.is_transient() => continue,
                Err(error) => panic!("{error}"),
            }
        };
        assert_eq!(answer.payload, answer_of(request_id));
    }
    let mut streams = 0;
    while scripted.streams.try_recv().is_ok() {
        streams += 1;
    }
    assert!(streams >= 3, "a stream for each call: {streams}");
}
