//! What the HTTP API's users share with the server: the API client, the
//! job file reader (HCL) and the formats of durations and times.

pub mod client;
pub mod format;
pub mod hcl;

use axum::http::HeaderMap;

/// The node attribute that carries the agent's HTTP address.
pub const ADVERTISE_ATTRIBUTE: &str = "unique.advertise.http";

/// The secret a request carries, if any.
pub fn secret_of(headers: &HeaderMap) -> Option<String> {
    if let Some(token) = headers.get("x-nomad-token").and_then(|value| value.to_str().ok()) {
        return Some(token.trim().to_string()).filter(|token| !token.is_empty());
    }
    let bearer = headers.get("authorization").and_then(|value| value.to_str().ok())?;
    bearer.strip_prefix("Bearer ").map(|token| token.trim().to_string()).filter(|token| !token.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_comes_from_x_nomad_token_or_a_bearer_header() {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer abc".parse().expect("header"));
        assert_eq!(secret_of(&headers).as_deref(), Some("abc"));
        headers.insert("x-nomad-token", "def".parse().expect("header"));
        assert_eq!(secret_of(&headers).as_deref(), Some("def"));
        assert_eq!(secret_of(&HeaderMap::new()), None);
    }
}
