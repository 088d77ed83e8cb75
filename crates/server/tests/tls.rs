//! A TLS cluster of real processes, set up as README's secure section says:
//! certificates from `fencelock cert`, `fencelockd --certs-dir`, and the
//! Rust client and the CLI with a user's certificate. Plain TCP, another
//! CA's user and a peer without a certificate are refused with a clear
//! message, and the nodes serve on. Bad certificates stop a node at start,
//! naming the file.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{fencelock, free_port, Cluster, DEADLINE};
use fencelock_client::{Client, ClientConfig, ClientError, TlsConfig};

/// Makes a CA, nodes 1 to `nodes` on 127.0.0.1, and the users in `users`.
fn make_certs(dir: &Path, nodes: u64, users: &[&str]) {
    make_certs_of(dir, nodes, users, None);
}

/// [`make_certs`], with a CA that names the cluster `cluster` when given.
fn make_certs_of(dir: &Path, nodes: u64, users: &[&str], cluster: Option<&str>) {
    let dir = dir.to_str().unwrap();
    let mut create_ca = vec!["cert", "create-ca", "--certs-dir", dir];
    create_ca.extend(cluster.map(|cluster| ["--cluster", cluster]).iter().flatten());
    let made = fencelock(&create_ca);
    assert!(made.status.success(), "{made:?}");
    for id in 1..=nodes {
        let id = id.to_string();
        let made =
            fencelock(&["cert", "create-node", "--certs-dir", dir, "--id", &id, "127.0.0.1", "localhost"]);
        assert!(made.status.success(), "{made:?}");
    }
    for user in users {
        assert!(fencelock(&["cert", "create-client", "--certs-dir", dir, user]).status.success());
    }
}

/// A cluster of `size` nodes speaking TLS, started, with certificates for
/// its nodes and `users` in its `certs` directory.
fn tls_cluster(size: u64, users: &[&str]) -> (Cluster, std::path::PathBuf) {
    let mut cluster = Cluster::configure(size);
    let certs = cluster.dir.path().join("certs");
    make_certs(&certs, size, users);
    for node in &mut cluster.nodes {
        node.extra_args = vec!["--certs-dir".into(), certs.display().to_string()];
    }
    for id in 1..=size {
        cluster.launch(id);
    }
    (cluster, certs)
}

fn client(cluster: &Cluster, tls: Option<(&Path, &str)>, retry_for: Duration) -> Result<Client, ClientError> {
    let mut config = ClientConfig::new(cluster.endpoints());
    config.request_timeout = Duration::from_secs(2);
    config.retry_for = retry_for;
    config.tls = tls.map(|(dir, user)| TlsConfig { certs_dir: dir.to_owned(), user: user.to_owned() });
    Client::connect(config)
}

#[test]
fn a_tls_cluster_serves_its_users_and_refuses_everyone_else() {
    let (cluster, certs) = tls_cluster(3, &["alice"]);

    // The Rust client, as alice.
    let alice = client(&cluster, Some((&certs, "alice")), DEADLINE).unwrap();
    let guard = alice.acquire(b"jobs/tls", Duration::from_secs(30), Duration::ZERO).unwrap();
    assert!(alice.check(b"jobs/tls", guard.token()).unwrap());

    // The CLI, as alice.
    let endpoints = cluster.endpoints().join(",");
    let dir = certs.to_str().unwrap();
    let base = ["--endpoints", &endpoints, "--certs-dir", dir, "--user", "alice"];
    let acquired = fencelock(&[&base[..], &["--json", "acquire", "jobs/cli", "--ttl", "30s"]].concat());
    assert!(acquired.status.success(), "{acquired:?}");
    let answer: serde_json::Value = serde_json::from_slice(&acquired.stdout).unwrap();
    assert!(answer["token"].as_u64().unwrap() > guard.token(), "{answer}");
    let status = fencelock(&[&base[..], &["status"]].concat());
    assert!(status.status.success(), "{status:?}");

    // Plain TCP to the TLS ports: refused, with the server's closing as
    // the reason.
    // With the whole default budget to retry: every node refused it, so
    // the call fails at once instead of waiting it out.
    let plain = client(&cluster, None, DEADLINE).unwrap();
    let err = plain.check(b"jobs/tls", guard.token()).unwrap_err();
    assert!(err.to_string().contains("the server speaks TLS"), "{err}");
    assert!(err.to_string().contains("every endpoint refused"), "{err}");
    let plain_cli = fencelock(&["--endpoints", &endpoints, "get", "jobs/tls"]);
    assert_eq!(plain_cli.status.code(), Some(1), "{plain_cli:?}");
    assert!(String::from_utf8_lossy(&plain_cli.stderr).contains("the server speaks TLS"), "{plain_cli:?}");

    // A user of another cluster's CA: the handshake fails, and says why.
    let other = cluster.dir.path().join("other-certs");
    make_certs(&other, 1, &["alice"]);
    let stranger = client(&cluster, Some((&other, "alice")), DEADLINE).unwrap();
    let err = stranger.check(b"jobs/tls", guard.token()).unwrap_err().to_string();
    assert!(err.contains("TLS handshake failed: invalid peer certificate"), "{err}");
    assert!(err.contains("every endpoint refused"), "{err}");

    // --certs-dir without --user is a usage error.
    let no_user = fencelock(&["--endpoints", &endpoints, "--certs-dir", dir, "status"]);
    assert_eq!(no_user.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&no_user.stderr).contains("--user"), "{no_user:?}");

    // A peer without a certificate: its hello goes nowhere.
    let mut peer = std::net::TcpStream::connect(cluster.peer_addr(1)).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let hello = fencelock_types::client_pb::PeerHello { node_id: 2, ..Default::default() };
    fencelock_net::write_frame(&mut peer, &hello).unwrap();
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut peer, &mut rest);
    assert!(rest.len() < 16, "a plain peer got an answer: {rest:?}");

    // Everyone else still served, tokens still increasing.
    let next = alice.acquire(b"jobs/after", Duration::from_secs(30), Duration::ZERO).unwrap();
    assert!(next.token() > answer["token"].as_u64().unwrap());
    for id in 1..=3 {
        let deadline = Instant::now() + DEADLINE;
        while alice.status(cluster.client_addr(id)).is_err() {
            assert!(Instant::now() < deadline, "node {id} stopped answering\n{}", cluster.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let log = cluster.log(1);
    assert!(log.contains("TLS"), "no refusal was logged:\n{log}");
}

/// Waits until `cluster`'s node 1 log holds `needle`.
fn wait_for_log(cluster: &Cluster, needle: &str) {
    let deadline = Instant::now() + DEADLINE;
    while !cluster.log(1).contains(needle) {
        assert!(Instant::now() < deadline, "no `{needle}` in the log\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sighup_reloads_the_certificates_to_rotate_the_ca_and_a_bad_reload_changes_nothing() {
    let mut cluster = Cluster::configure(1);
    let certs = cluster.dir.path().join("certs");
    make_certs_of(&certs, 1, &["alice"], Some("prod"));
    cluster.nodes[0].extra_args = vec!["--certs-dir".into(), certs.display().to_string()];
    cluster.launch(1);
    let alice = client(&cluster, Some((&certs, "alice")), DEADLINE).unwrap();
    let first = alice.acquire(b"jobs/rotate", Duration::from_secs(30), Duration::ZERO).unwrap();

    // A new CA that names the same cluster (docs/security.md), with a user
    // of its own who trusts both CAs; and one that forgot to, with carol.
    let new = cluster.dir.path().join("new-certs");
    make_certs_of(&new, 1, &["bob"], Some("prod"));
    let forgot = cluster.dir.path().join("forgot-certs");
    make_certs(&forgot, 1, &["carol"]);
    let both =
        [std::fs::read(certs.join("ca.crt")).unwrap(), std::fs::read(new.join("ca.crt")).unwrap()].concat();
    std::fs::write(new.join("ca.crt"), &both).unwrap();
    let all = [both.clone(), std::fs::read(forgot.join("ca.crt")).unwrap()].concat();
    std::fs::write(forgot.join("ca.crt"), &all).unwrap();
    let bob = |retry_for| client(&cluster, Some((&new, "bob")), retry_for).unwrap();
    // The node refuses bob's certificate (he learns it at his first read):
    // with every endpoint refusing, the call fails at once.
    let refused = bob(DEADLINE).check(b"jobs/rotate", first.token()).unwrap_err();
    assert!(refused.to_string().contains("every endpoint refused"), "{refused}");

    // The node trusts the three CAs after a SIGHUP.
    std::fs::write(certs.join("ca.crt"), &all).unwrap();
    let pid = nix::unistd::Pid::from_raw(cluster.nodes[0].child.as_ref().unwrap().id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    wait_for_log(&cluster, "certificates reloaded");
    assert!(bob(DEADLINE).check(b"jobs/rotate", first.token()).unwrap());
    // Carol's certificate names another cluster: refused by both sides.
    let carol = client(&cluster, Some((&forgot, "carol")), DEADLINE).unwrap();
    let refused = carol.check(b"jobs/rotate", first.token()).unwrap_err();
    assert!(refused.to_string().contains("cluster"), "{refused}");
    // Alice's connection, open since before, serves on.
    assert!(alice.check(b"jobs/rotate", first.token()).unwrap());

    // A broken file at the next SIGHUP: refused, and the node keeps what it
    // had for its new connections too.
    std::fs::write(certs.join("node-1.crt"), "not a certificate").unwrap();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    wait_for_log(&cluster, "certificate reload failed");
    assert!(cluster.log(1).contains("node-1.crt"), "the failure names the file\n{}", cluster.log(1));
    let fresh = client(&cluster, Some((&certs, "alice")), DEADLINE).unwrap();
    let next = fresh.acquire(b"jobs/after-reload", Duration::from_secs(30), Duration::ZERO).unwrap();
    assert!(next.token() > first.token());
    assert!(bob(DEADLINE).check(b"jobs/rotate", first.token()).unwrap());
}

#[test]
fn bad_certificates_stop_a_node_at_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let start = |certs: &Path| {
        let peers = format!("1=127.0.0.1:{}", free_port());
        let client_addr = format!("127.0.0.1:{}", free_port());
        let data = dir.path().join("data");
        let args = ["--peers", &peers, "--client-addr", &client_addr, "--data-dir", data.to_str().unwrap()];
        let output = Command::new(env!("CARGO_BIN_EXE_fencelockd"))
            .args(args)
            .arg("--certs-dir")
            .arg(certs)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
    };

    // No CA at all.
    std::fs::create_dir_all(&certs).unwrap();
    let (code, stderr) = start(&certs);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("ca.crt is missing"), "{stderr}");
    // --config-check checks the certificates too.
    let checked = Command::new(env!("CARGO_BIN_EXE_fencelockd"))
        .args(["--certs-dir", certs.to_str().unwrap(), "--config-check"])
        .output()
        .unwrap();
    assert_eq!(checked.status.code(), Some(1), "{checked:?}");
    assert!(String::from_utf8_lossy(&checked.stderr).contains("ca.crt is missing"), "{checked:?}");

    // A CA but no certificate for node 1.
    make_certs(&certs, 0, &[]);
    let (code, stderr) = start(&certs);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("node-1.crt is missing"), "{stderr}");

    // Node 2's certificate in node 1's place.
    make_certs_node(&certs, 2);
    std::fs::copy(certs.join("node-2.crt"), certs.join("node-1.crt")).unwrap();
    std::fs::copy(certs.join("node-2.key"), certs.join("node-1.key")).unwrap();
    let (code, stderr) = start(&certs);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("node-1.crt") && stderr.contains("names node 2"), "{stderr}");

    // An unreadable key: a directory where node 1's own key should be.
    std::fs::remove_file(certs.join("node-1.crt")).unwrap();
    std::fs::remove_file(certs.join("node-1.key")).unwrap();
    make_certs_node(&certs, 1);
    std::fs::remove_file(certs.join("node-1.key")).unwrap();
    std::fs::create_dir(certs.join("node-1.key")).unwrap();
    std::fs::set_permissions(certs.join("node-1.key"), std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .unwrap();
    let (code, stderr) = start(&certs);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("node-1.key"), "{stderr}");
}

fn make_certs_node(certs: &Path, id: u64) {
    let made = fencelock(&[
        "cert",
        "create-node",
        "--certs-dir",
        certs.to_str().unwrap(),
        "--id",
        &id.to_string(),
        "127.0.0.1",
    ]);
    assert!(made.status.success(), "{made:?}");
}

/// A TLS connection to node `to`'s peer port at `addr` that presents
/// `cert` and `key`, trusting any server certificate of the CA `ca`
/// (whatever cluster it names), with `hello` sent: `None` when the node
/// refused the handshake.
fn peer_connection(
    ca: &Path,
    cert: &Path,
    key: &Path,
    to: u64,
    addr: &str,
    hello: &fencelock_types::client_pb::PeerHello,
) -> Option<rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from_pem_file(ca).unwrap()).unwrap();
    let chain = vec![rustls::pki_types::CertificateDer::from_pem_file(cert).unwrap()];
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .unwrap();
    let session =
        rustls::ClientConnection::new(std::sync::Arc::new(config), fencelock_tls::peer_server_name(to))
            .unwrap();
    let socket = std::net::TcpStream::connect(addr).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut stream = rustls::StreamOwned::new(session, socket);
    let mut frame = Vec::new();
    fencelock_net::encode_frame(hello, &mut frame);
    std::io::Write::write_all(&mut stream, &frame).ok()?;
    std::io::Write::flush(&mut stream).ok()?;
    // TLS 1.3: the server's verdict on our certificate comes after our
    // side is done; a read shows it.
    let mut byte = [0u8; 1];
    match std::io::Read::read(&mut stream, &mut byte) {
        Err(err)
            if err.kind() == std::io::ErrorKind::WouldBlock || err.kind() == std::io::ErrorKind::TimedOut =>
        {
            Some(stream)
        }
        _ => None,
    }
}

#[test]
fn a_node_certificate_of_another_cluster_under_the_same_ca_is_refused_and_redirects_no_client() {
    let (cluster, certs) = tls_cluster(3, &["alice"]);
    let alice = client(&cluster, Some((&certs, "alice")), DEADLINE).unwrap();
    let first = alice.acquire(b"jobs/fenced", Duration::from_secs(30), Duration::ZERO).unwrap();
    let leader = alice.status(cluster.client_addr(1)).unwrap().leader_id;
    assert!(leader != 0);
    let follower = (1..=3).find(|id| *id != leader).unwrap();

    // Where the forged hellos point clients: it counts who comes.
    let evil = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    evil.set_nonblocking(true).unwrap();
    let evil_addr = evil.local_addr().unwrap().to_string();

    // The same CA signs for a second cluster: its node with the leader's id.
    let other = cluster.dir.path().join("other-certs");
    std::fs::create_dir_all(&other).unwrap();
    for file in ["ca.crt", "ca.key"] {
        std::fs::copy(certs.join(file), other.join(file)).unwrap();
    }
    let dir = other.to_str().unwrap();
    let id = leader.to_string();
    let made = fencelock(&[
        "cert",
        "create-node",
        "--certs-dir",
        dir,
        "--id",
        &id,
        "--cluster",
        "other",
        "127.0.0.1",
    ]);
    assert!(made.status.success(), "{made:?}");
    let hello = fencelock_types::client_pb::PeerHello {
        node_id: leader,
        client_addr: evil_addr.clone(),
        ..Default::default()
    };
    let (cert, key) = (other.join(format!("node-{leader}.crt")), other.join(format!("node-{leader}.key")));
    let follower_peer = cluster.peer_addr(follower).to_owned();
    assert!(
        peer_connection(&certs.join("ca.crt"), &cert, &key, follower, &follower_peer, &hello).is_none(),
        "a node certificate of another cluster was taken on the peer port"
    );

    // An operator who forgot --cluster: the certificate names this
    // cluster. Its hello hides the cluster id and points at the evil
    // address.
    let made =
        fencelock(&["cert", "create-node", "--certs-dir", dir, "--id", &id, "--overwrite", "127.0.0.1"]);
    assert!(made.status.success(), "{made:?}");
    let hidden = peer_connection(&certs.join("ca.crt"), &cert, &key, follower, &follower_peer, &hello)
        .expect("a node of this cluster's CA and name that names no cluster id is taken as a blank node");

    // A client that knows only the follower is sent to the real leader.
    let mut config = ClientConfig::new(vec![cluster.client_addr(follower).to_owned()]);
    config.retry_for = DEADLINE;
    config.tls = Some(TlsConfig { certs_dir: certs.clone(), user: "alice".into() });
    let via_follower = Client::connect(config).unwrap();
    for n in 0..20 {
        let guard =
            via_follower.acquire(format!("jobs/after-{n}"), Duration::from_secs(30), Duration::ZERO).unwrap();
        assert!(guard.token() > first.token());
    }
    let status = alice.status(cluster.client_addr(follower)).unwrap();
    assert_eq!(status.leader_addr, cluster.client_addr(leader), "{status:?}");
    assert!(evil.accept().is_err(), "a client was sent to the forged address");
    drop(hidden);
}

/// Starts `fencelockd` with `args`, logging to `log`; killed when dropped.
struct Joiner(std::process::Child);

impl Joiner {
    fn start(args: &[String], log: &Path) -> Joiner {
        let out = std::fs::File::create(log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_fencelockd"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Joiner(child)
    }
}

impl Drop for Joiner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_node_joins_over_tls_with_its_own_certificate_once_an_admin_added_it_and_does_nothing_else() {
    let mut cluster = Cluster::configure(3);
    let certs = cluster.dir.path().join("certs");
    make_certs(&certs, 5, &["ops", "alice"]);
    let config = cluster.dir.path().join("cluster.toml");
    std::fs::write(&config, "admins = [\"ops\"]\n").unwrap();
    for node in &mut cluster.nodes {
        node.extra_args = vec![
            "--certs-dir".into(),
            certs.display().to_string(),
            "--config".into(),
            config.display().to_string(),
        ];
    }
    for id in 1..=3 {
        cluster.launch(id);
    }
    let ops = client(&cluster, Some((&certs, "ops")), DEADLINE).unwrap();
    let first = ops.acquire(b"jobs/before", Duration::from_secs(60), Duration::ZERO).unwrap();

    // Node 4's machine holds ca.crt and its own pair: no admin key.
    let node_certs = |id: u64| {
        let dir = cluster.dir.path().join(format!("certs-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        for file in ["ca.crt".to_owned(), format!("node-{id}.crt"), format!("node-{id}.key")] {
            std::fs::copy(certs.join(&file), dir.join(&file)).unwrap();
        }
        dir
    };
    let args = |id: u64, peer: &str, client_addr: &str| -> Vec<String> {
        let data = cluster.dir.path().join(format!("data-{id}"));
        [
            "--id",
            &id.to_string(),
            "--peers",
            &format!("{id}={peer}"),
            "--client-addr",
            client_addr,
            "--data-dir",
            data.to_str().unwrap(),
            "--certs-dir",
            node_certs(id).to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--join",
            &cluster.endpoints().join(","),
        ]
        .iter()
        .map(|arg| (*arg).to_owned())
        .collect()
    };

    // Node 5, which no admin added: refused, and told what to run.
    let (peer5, client5) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let log5 = cluster.dir.path().join("node-5.log");
    let mut five = Joiner::start(&args(5, &peer5, &client5), &log5);
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = five.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "node 5 joined without an admin's member add");
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = std::fs::read_to_string(&log5).unwrap();
    assert_eq!(status.code(), Some(4), "{log}");
    assert!(log.contains("fencelock member add 5"), "the refusal does not say what to run:\n{log}");
    assert!(!ops.member_list().unwrap().members.iter().any(|member| member.id == 5));

    // Node 4: added by the admin, then started as member add printed,
    // with its own certificate.
    let (peer4, client4) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let endpoints = cluster.endpoints().join(",");
    let dir = certs.to_str().unwrap();
    let added = fencelock(&[
        "--endpoints",
        &endpoints,
        "--certs-dir",
        dir,
        "--user",
        "ops",
        "member",
        "add",
        "4",
        &peer4,
        &client4,
    ]);
    assert!(added.status.success(), "{added:?}");
    let log4 = cluster.dir.path().join("node-4.log");
    let _four = Joiner::start(&args(4, &peer4, &client4), &log4);
    let deadline = Instant::now() + DEADLINE;
    loop {
        let voters = ops.member_list().map(|membership| {
            membership.members.iter().filter(|member| member.role.starts_with("voter")).count()
        });
        if voters.as_ref().is_ok_and(|voters| *voters == 4) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 4 never became a voter: {voters:?}\n{}",
            std::fs::read_to_string(&log4).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let next = ops.acquire(b"jobs/after", Duration::from_secs(60), Duration::ZERO).unwrap();
    assert!(next.token() > first.token());

    // Node 4's certificate on the client port: it joins, and nothing else.
    let mut config = ClientConfig::new(cluster.endpoints());
    config.retry_for = DEADLINE;
    config.tls = Some(TlsConfig { certs_dir: certs.clone(), user: "node/4".into() });
    let as_node = Client::connect(config).unwrap();
    assert!(as_node.member_list().is_ok());
    for refused in [
        as_node.acquire(b"jobs/stolen", Duration::from_secs(60), Duration::ZERO).map(|_| ()),
        as_node.force_release(b"jobs/before").map(|_| ()),
        as_node.member_remove(1).map(|_| ()),
        as_node.member_add(9, "127.0.0.1:1", "127.0.0.1:2").map(|_| ()),
        as_node.member_promote(5).map(|_| ()),
    ] {
        assert!(matches!(refused, Err(ClientError::PermissionDenied(_))), "{refused:?}");
    }
    assert!(ops.check(b"jobs/before", first.token()).unwrap());
}
