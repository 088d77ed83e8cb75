//! `fencelock cert` as a user runs it: the files, their modes, the exit
//! codes and the messages.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

fn fencelock(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .args(args)
        .env_remove("FENCELOCK_CERTS_DIR")
        .output()
        .unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_cert_commands_write_a_cluster_layout_and_refuse_to_clobber_it() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let certs = certs.to_str().unwrap();

    let without_ca = fencelock(&["cert", "create-node", "--certs-dir", certs, "--id", "1", "127.0.0.1"]);
    assert_eq!(without_ca.status.code(), Some(1), "{without_ca:?}");
    assert!(stderr(&without_ca).contains("run `fencelock cert create-ca"), "{without_ca:?}");

    let ca = fencelock(&["cert", "create-ca", "--certs-dir", certs]);
    assert!(ca.status.success(), "{ca:?}");
    assert!(String::from_utf8_lossy(&ca.stdout).contains("ca.key"));
    for id in ["1", "2", "3"] {
        let node =
            fencelock(&["cert", "create-node", "--certs-dir", certs, "--id", id, "127.0.0.1", "localhost"]);
        assert!(node.status.success(), "{node:?}");
    }
    let client = fencelock(&["--json", "cert", "create-client", "--certs-dir", certs, "alice"]);
    assert!(client.status.success(), "{client:?}");
    let written: serde_json::Value = serde_json::from_slice(&client.stdout).unwrap();
    assert_eq!(written["written"].as_array().unwrap().len(), 2, "{written}");

    let mut names: Vec<String> = std::fs::read_dir(certs)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "ca.crt",
            "ca.key",
            "client-alice.crt",
            "client-alice.key",
            "node-1.crt",
            "node-1.key",
            "node-2.crt",
            "node-2.key",
            "node-3.crt",
            "node-3.key"
        ]
    );
    for name in names.iter().filter(|name| name.ends_with(".key")) {
        let mode = std::fs::metadata(dir.path().join("certs").join(name)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{name}");
    }

    let again = fencelock(&["cert", "create-ca", "--certs-dir", certs]);
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("exists; pass --overwrite"), "{again:?}");
    let bad_name = fencelock(&["cert", "create-client", "--certs-dir", certs, "a/b"]);
    assert_eq!(bad_name.status.code(), Some(1));
    assert!(stderr(&bad_name).contains("user name `a/b`"), "{bad_name:?}");
    let no_host = fencelock(&["cert", "create-node", "--certs-dir", certs, "--id", "4"]);
    assert_eq!(no_host.status.code(), Some(1), "{no_host:?}");
    let no_dir = fencelock(&["cert", "create-ca"]);
    assert_eq!(no_dir.status.code(), Some(1), "{no_dir:?}");
    assert!(stderr(&no_dir).contains("--certs-dir"), "{no_dir:?}");
}
