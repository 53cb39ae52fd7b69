//! An allocation's files as the client endpoints answer them (Nomad's
//! `api/fs.go`): a directory's entries and one file's information
//! (`AllocFileInfo`), and the frames of a streamed file or log
//! (`StreamFrame`).

use serde::{Deserialize, Serialize};

/// A file or directory of an allocation (`AllocFileInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocFileInfo {
    /// Its name.
    pub name: String,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Its size in bytes.
    pub size: u64,
    /// Its mode as Go prints it (`drwxr-xr-x`, `-rw-r--r--`).
    pub file_mode: String,
    /// When it was last modified (RFC 3339).
    pub mod_time: String,
}

impl From<&transport::message::FileInfo> for AllocFileInfo {
    fn from(file: &transport::message::FileInfo) -> Self {
        let mod_time = engine::clock::Timestamp(u64::try_from(file.mod_time).unwrap_or(0));
        AllocFileInfo {
            name: file.name.clone(),
            is_dir: file.is_dir,
            size: file.size,
            file_mode: file_mode(file.mode),
            mod_time: super::format::rfc3339(mod_time),
        }
    }
}

/// `st_mode` as Go's `os.FileMode.String` writes it: the type letter
/// (`d` directory, `L` symlink, `p` pipe, `S` socket, `D` device, `-`
/// a plain file) and the nine permission bits.
pub fn file_mode(mode: u32) -> String {
    let kind = match mode & 0o170_000 {
        0o040_000 => 'd',
        0o120_000 => 'L',
        0o010_000 => 'p',
        0o140_000 => 'S',
        0o020_000 | 0o060_000 => 'D',
        _ => '-',
    };
    let mut text = String::from(kind);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 0o7;
        text.push(if bits & 0o4 != 0 { 'r' } else { '-' });
        text.push(if bits & 0o2 != 0 { 'w' } else { '-' });
        text.push(if bits & 0o1 != 0 { 'x' } else { '-' });
    }
    text
}

/// One frame of a streamed file or log (`StreamFrame`), the JSON objects
/// a streaming answer is made of, one after another. Nomad sends `{}` as
/// a heartbeat; every field is left out when empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct StreamFrame {
    /// The offset in `file` after this frame's data.
    #[serde(skip_serializing_if = "is_zero")]
    pub offset: u64,
    /// The data, base64.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub data: String,
    /// The file the data is from, relative to the allocation's directory.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub file: String,
    /// A file event (`file deleted`, `file truncated`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub file_event: String,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

impl StreamFrame {
    /// The frame of `data` read from `file` up to `offset`.
    pub fn of(file: String, offset: u64, data: &[u8]) -> StreamFrame {
        use base64::Engine as _;
        let data = base64::engine::general_purpose::STANDARD.encode(data);
        StreamFrame { offset, data, file, file_event: String::new() }
    }

    /// The frame's data, decoded.
    pub fn bytes(&self) -> Result<Vec<u8>, base64::DecodeError> {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.decode(&self.data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_as_go_prints_them() {
        assert_eq!(file_mode(0o040_755), "drwxr-xr-x");
        assert_eq!(file_mode(0o100_644), "-rw-r--r--");
        assert_eq!(file_mode(0o120_777), "Lrwxrwxrwx");
        assert_eq!(file_mode(0o100_700), "-rwx------");
    }

    #[test]
    fn a_frame_leaves_out_what_is_empty_and_carries_its_data_in_base64() {
        let frame = StreamFrame::of("alloc/logs/web.stdout.0".into(), 6, b"hello\n");
        let json = serde_json::to_value(&frame).expect("serializes");
        assert_eq!(json, serde_json::json!({"Offset": 6, "Data": "aGVsbG8K", "File": "alloc/logs/web.stdout.0"}));
        assert_eq!(serde_json::to_string(&StreamFrame::default()).expect("serializes"), "{}");
        let back: StreamFrame = serde_json::from_value(json).expect("reads back");
        assert_eq!(back.bytes().expect("base64"), b"hello\n");
    }
}
