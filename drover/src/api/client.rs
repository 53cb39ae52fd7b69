//! A small client of the HTTP API, for the `drover` CLI and the tests: one
//! HTTP/1.1 request per connection, over HTTPS with the cluster CA or
//! plain HTTP, with the ACL token when one is set. Addresses, token and CA
//! come from flags or `DROVER_ADDR`, `DROVER_TOKEN` and `DROVER_CACERT`.
//! As Nomad's `api.Client`, [`ApiClient::query`] and [`ApiClient::write`]
//! read an answer into its struct of this model.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::Request;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// Percent-encodes what a query value may not hold as it is.
pub fn query_value(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b':' | b'*' => {
                char::from(byte).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Where the API is and how to reach it.
#[derive(Clone, Debug)]
pub struct ApiClient {
    https: bool,
    host: String,
    port: u16,
    token: Option<String>,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// Sent as `?namespace=` on every request that names none.
    namespace: Option<String>,
}

/// An answer: status, the `X-Nomad-Index` header, the body.
#[derive(Clone, Debug)]
pub struct ApiResponse {
    /// The HTTP status code.
    pub status: u16,
    /// `X-Nomad-Index`, when sent.
    pub index: Option<u64>,
    /// `X-Nomad-NextToken`, when sent: where the next page starts.
    pub next_token: Option<String>,
    /// The body as text.
    pub body: String,
    /// The body as it came (a snapshot file is not text).
    pub raw: Bytes,
}

impl ApiResponse {
    /// The body as JSON, or an error with the status and body when the
    /// status is not 200.
    pub fn json(&self) -> Result<Value> {
        if self.status != 200 {
            bail!("Unexpected response code: {} ({})", self.status, self.body.trim());
        }
        serde_json::from_str(&self.body).with_context(|| format!("the answer is not JSON: {:?}", self.body))
    }

    /// The body as `T`, or an error with the status and body when the
    /// status is not 200.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T> {
        if self.status != 200 {
            bail!("Unexpected response code: {} ({})", self.status, self.body.trim());
        }
        serde_json::from_str(&self.body)
            .with_context(|| format!("the answer is not a {}: {:?}", std::any::type_name::<T>(), self.body))
    }
}

impl ApiClient {
    /// A client of `address` (`http://host:port` or `https://host:port`;
    /// a bare `host:port` is HTTPS), trusting `ca_pem` for HTTPS.
    pub fn new(address: &str, token: Option<String>, ca_pem: Option<&str>) -> Result<ApiClient> {
        let (https, rest) = match address.split_once("://") {
            Some(("http", rest)) => (false, rest),
            Some(("https", rest)) => (true, rest),
            Some((scheme, _)) => bail!("address {address:?}: scheme {scheme:?} is not http or https"),
            None => (true, address),
        };
        let rest = rest.trim_end_matches('/');
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), port.parse().with_context(|| format!("port in {address:?}"))?),
            None => (rest.to_string(), 4646),
        };
        let tls = match (https, ca_pem) {
            (false, _) => None,
            (true, ca) => Some(client_tls(ca)?),
        };
        Ok(ApiClient { https, host, port, token, tls, namespace: None })
    }

    /// The same client, naming `namespace` on every request whose path
    /// names none (Nomad's `-namespace` and `NOMAD_NAMESPACE`).
    pub fn with_namespace(mut self, namespace: Option<String>) -> ApiClient {
        self.namespace = namespace.filter(|namespace| !namespace.is_empty());
        self
    }

    /// `path` with the client's namespace, unless it names one.
    fn in_namespace(&self, path: &str) -> String {
        let Some(namespace) = &self.namespace else { return path.to_string() };
        let query = path.split_once('?').map_or("", |(_, query)| query);
        if query.split('&').any(|pair| pair.starts_with("namespace=")) {
            return path.to_string();
        }
        let separator = if path.contains('?') { '&' } else { '?' };
        format!("{path}{separator}namespace={}", query_value(namespace))
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<ApiResponse> {
        self.request("GET", path, None).await
    }

    /// `GET path`, its answer read as `T` (Nomad's `query`).
    pub async fn query<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.get(path).await?.decode()
    }

    /// `GET path`, its answer read as `T`, with its `X-Nomad-Index` (for
    /// the next blocking query).
    pub async fn query_indexed<T: DeserializeOwned>(&self, path: &str) -> Result<(T, Option<u64>)> {
        let answer = self.get(path).await?;
        Ok((answer.decode()?, answer.index))
    }

    /// `method path` with `body` as JSON, its answer read as `T` (Nomad's
    /// `put` and `delete`).
    pub async fn write<T: DeserializeOwned>(&self, method: &str, path: &str, body: &impl Serialize) -> Result<T> {
        self.send(method, path, Bytes::from(serde_json::to_vec(body)?)).await?.decode()
    }

    /// `method path` without a body, its answer read as `T`.
    pub async fn write_empty<T: DeserializeOwned>(&self, method: &str, path: &str) -> Result<T> {
        self.send(method, path, Bytes::new()).await?.decode()
    }

    /// Sends one request; `body` is sent as JSON.
    pub async fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Result<ApiResponse> {
        let bytes = match body {
            Some(body) => Bytes::from(serde_json::to_vec(body)?),
            None => Bytes::new(),
        };
        self.send(method, path, bytes).await
    }

    /// Sends one request with a raw body.
    pub async fn send(&self, method: &str, path: &str, body: Bytes) -> Result<ApiResponse> {
        let stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .with_context(|| format!("connecting to {}:{}", self.host, self.port))?;
        let mut request = Request::builder().method(method).uri(self.in_namespace(path)).header("host", &self.host);
        if let Some(token) = &self.token {
            request = request.header("x-nomad-token", token);
        }
        let request = request.body(Full::new(body))?;
        let response = match &self.tls {
            Some(tls) => {
                let name = ServerName::try_from(self.host.clone()).context("the server's name")?;
                let stream = tokio_rustls::TlsConnector::from(tls.clone())
                    .connect(name, stream)
                    .await
                    .context("the TLS handshake with the server")?;
                exchange(TokioIo::new(stream), request).await?
            }
            None => exchange(TokioIo::new(stream), request).await?,
        };
        Ok(response)
    }

    /// `GET path`, its answer's body read as it comes ([`ApiStream`]): a
    /// followed log or file. Dropping the stream closes the connection,
    /// which ends the stream on the server.
    pub async fn stream(&self, path: &str) -> Result<ApiStream> {
        let stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .with_context(|| format!("connecting to {}:{}", self.host, self.port))?;
        let mut request = Request::builder().method("GET").uri(self.in_namespace(path)).header("host", &self.host);
        if let Some(token) = &self.token {
            request = request.header("x-nomad-token", token);
        }
        let request = request.body(Full::new(Bytes::new()))?;
        match &self.tls {
            Some(tls) => {
                let name = ServerName::try_from(self.host.clone()).context("the server's name")?;
                let stream = tokio_rustls::TlsConnector::from(tls.clone())
                    .connect(name, stream)
                    .await
                    .context("the TLS handshake with the server")?;
                open_stream(TokioIo::new(stream), request).await
            }
            None => open_stream(TokioIo::new(stream), request).await,
        }
    }

    /// Whether requests go over HTTPS.
    pub fn is_https(&self) -> bool {
        self.https
    }

    /// `host:port` of the server.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

async fn exchange<IO>(io: IO, request: Request<Full<Bytes>>) -> Result<ApiResponse>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    let driving = tokio::spawn(connection);
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let index = response
        .headers()
        .get("x-nomad-index")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok());
    let next_token =
        response.headers().get("x-nomad-nexttoken").and_then(|value| value.to_str().ok()).map(str::to_string);
    let body = response.into_body().collect().await?.to_bytes();
    driving.abort();
    let text = String::from_utf8_lossy(&body).into_owned();
    Ok(ApiResponse { status, index, next_token, body: text, raw: body })
}

/// An answer whose body is read as it comes ([`ApiClient::stream`]).
#[derive(Debug)]
pub struct ApiStream {
    /// The HTTP status code.
    pub status: u16,
    body: hyper::body::Incoming,
    /// What was read of the body and not yet taken as a frame.
    pending: Vec<u8>,
    driving: tokio::task::JoinHandle<()>,
}

impl ApiStream {
    /// The next piece of the body as it came; `None` at its end.
    pub async fn next(&mut self) -> Result<Option<Bytes>> {
        if !self.pending.is_empty() {
            return Ok(Some(Bytes::from(std::mem::take(&mut self.pending))));
        }
        while let Some(frame) = self.body.frame().await {
            if let Ok(data) = frame.context("reading the answer")?.into_data() {
                return Ok(Some(data));
            }
        }
        Ok(None)
    }

    /// The next of Nomad's `StreamFrame`s (the JSON objects of a framed
    /// log or file stream); `None` at the body's end. Heartbeats (`{}`)
    /// are skipped.
    pub async fn next_frame(&mut self) -> Result<Option<super::fs::StreamFrame>> {
        loop {
            match self.next_value::<super::fs::StreamFrame>().await? {
                Some(frame) if frame == super::fs::StreamFrame::default() => continue,
                other => return Ok(other),
            }
        }
    }

    /// The next JSON value of a body of successive values (a stream of
    /// frames, or newline-delimited JSON); `None` at the body's end.
    pub async fn next_value<T: DeserializeOwned>(&mut self) -> Result<Option<T>> {
        loop {
            let mut values = serde_json::Deserializer::from_slice(&self.pending).into_iter::<T>();
            match values.next() {
                Some(Ok(value)) => {
                    let used = values.byte_offset();
                    self.pending.drain(..used);
                    return Ok(Some(value));
                }
                Some(Err(error)) if !error.is_eof() => bail!("a malformed stream frame: {error}"),
                _ => {}
            }
            let Some(frame) = self.body.frame().await else {
                if self.pending.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                bail!("the stream ended in the middle of a frame");
            };
            if let Ok(data) = frame.context("reading the answer")?.into_data() {
                self.pending.extend_from_slice(&data);
            }
        }
    }

    /// The whole body as text (an error's message).
    pub async fn text(mut self) -> String {
        let mut text = std::mem::take(&mut self.pending);
        while let Ok(Some(data)) = self.next().await {
            text.extend_from_slice(&data);
        }
        String::from_utf8_lossy(&text).trim().to_string()
    }

    /// The stream if its status is 200, else an error with the status and body.
    pub async fn ok(self) -> Result<ApiStream> {
        if self.status == 200 {
            return Ok(self);
        }
        let status = self.status;
        bail!("Unexpected response code: {status} ({})", self.text().await)
    }
}

impl Drop for ApiStream {
    fn drop(&mut self) {
        self.driving.abort();
    }
}

async fn open_stream<IO>(io: IO, request: Request<Full<Bytes>>) -> Result<ApiStream>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    let driving = tokio::spawn(async move {
        let _ = connection.await;
    });
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    Ok(ApiStream { status, body: response.into_body(), pending: Vec::new(), driving })
}

/// TLS for HTTPS: the cluster CA when given, else the CA file must be given.
fn client_tls(ca_pem: Option<&str>) -> Result<Arc<rustls::ClientConfig>> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let Some(ca_pem) = ca_pem else {
        bail!("HTTPS needs the cluster CA: pass -ca-cert or set DROVER_CACERT (or use http:// in dev mode)");
    };
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.context("reading the CA certificate")?).context("adding the CA certificate")?;
    }
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
