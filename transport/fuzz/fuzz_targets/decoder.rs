//! Frames and messages from arbitrary bytes, as the server reads a stream:
//! `cargo fuzz run decoder` (see the README for the stable-toolchain form).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    transport::message::decode_all(data);
});
