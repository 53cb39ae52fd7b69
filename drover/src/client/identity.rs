//! A client's identity (node id and secret), kept in its data dir so a
//! restarted agent is the same node to the servers.

use std::path::{Path, PathBuf};

use engine::structs::NodeId;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The node id and the secret every call carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The node's id.
    pub node_id: NodeId,
    /// Its secret.
    pub secret_id: Uuid,
}

/// Why the identity could not be read or kept.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// Reading or writing the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not an identity.
    #[error("{path}: not a node identity: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// The file under the data dir.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("client").join("node-identity.json")
}

/// The identity kept in `data_dir`, or a new one written there (to a temp
/// file, synced, then renamed, so a crash leaves the old one or the new one).
/// The file holds the node's secret: it is readable by the agent's user
/// only, in the agent's own 0700 directory (one an older build left
/// readable is tightened).
pub fn load_or_create(data_dir: &Path) -> Result<Identity, IdentityError> {
    let path = path(data_dir);
    let io = |source| IdentityError::Io { path: path.clone(), source };
    let dir = path.parent().expect("the identity file has a directory");
    storage::create_private_dir(dir).map_err(io)?;
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            storage::tighten(&path, storage::FILE_MODE).map_err(io)?;
            return serde_json::from_str(&text)
                .map_err(|error| IdentityError::Corrupt { path: path.clone(), reason: error.to_string() });
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(io(error)),
    }
    let identity = Identity {
        node_id: NodeId::from_rng(&mut rand::rng()),
        secret_id: uuid::Builder::from_random_bytes(rand::random()).into_uuid(),
    };
    let text = serde_json::to_string_pretty(&identity).expect("an identity serializes");
    crate::client::alloc_dir::write_private(&path, text.as_bytes()).map_err(io)?;
    Ok(identity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_survives_a_restart() {
        let dir = std::env::temp_dir().join(format!("drover-identity-{}", std::process::id()));
        let first = load_or_create(&dir).expect("created");
        let mode =
            |path: &Path| std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path).expect("").permissions());
        assert_eq!(
            (mode(&path(&dir)) & 0o777, mode(&dir.join("client")) & 0o777),
            (0o600, 0o700),
            "the secret is private"
        );
        assert_eq!(load_or_create(&dir).expect("read back"), first);
        std::fs::write(path(&dir), "{").expect("corrupt it");
        assert!(matches!(load_or_create(&dir), Err(IdentityError::Corrupt { .. })));
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
