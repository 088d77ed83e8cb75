//! Generates the Rust code for `proto/fencelock.proto` with the pure-Rust
//! protobuf parser, so building needs no `protoc` on the machine.

use std::{env, fs, path::PathBuf};

fn main() {
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    for name in ["fencelock", "client"] {
        let proto = format!("proto/{name}.proto");
        println!("cargo:rerun-if-changed={proto}");
        protobuf_codegen_pure::Codegen::new()
            .out_dir(&out_dir)
            .include("proto")
            .input(&proto)
            .run()
            .unwrap_or_else(|err| panic!("protobuf codegen failed for {proto}: {err}"));

        // The generated file opens with inner attributes (`#![...]`) and inner
        // doc comments, which `include!` cannot take inside a module: drop
        // them, the including module carries the allows instead.
        let path = out_dir.join(format!("{name}.rs"));
        let text = fs::read_to_string(&path).expect("generated file is readable");
        let kept: String = text
            .lines()
            .filter(|line| !line.starts_with("#![") && !line.starts_with("//!"))
            .map(|line| format!("{line}\n"))
            .collect();
        fs::write(&path, kept).expect("generated file is writable");
    }
}
