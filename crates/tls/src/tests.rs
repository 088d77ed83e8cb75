//! The certificates as a user gets them: files and modes, who each names,
//! who signed it, and the errors for a missing CA, a mismatched key and bad
//! names.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;

use x509_parser::extensions::GeneralName;
use x509_parser::pem::parse_x509_pem;

use super::*;

fn der(path: &Path) -> Vec<u8> {
    let text = fs::read(path).unwrap();
    parse_x509_pem(&text).unwrap().1.contents
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Whether `leaf` is signed by `ca`'s key.
fn signed_by(leaf: &[u8], ca: &[u8]) -> bool {
    let (_, leaf) = x509_parser::parse_x509_certificate(leaf).unwrap();
    let (_, ca) = x509_parser::parse_x509_certificate(ca).unwrap();
    leaf.verify_signature(Some(ca.public_key())).is_ok()
}

#[test]
fn a_ca_then_node_and_client_certificates_that_name_who_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(dir.path().join("certs"));
    let written = create_ca(&layout, false).unwrap();
    assert_eq!(written, vec![layout.ca_cert(), layout.ca_key()]);
    assert_eq!(mode(&layout.ca_key()), 0o600);
    assert_eq!(mode(&layout.ca_cert()), 0o644);

    let hosts = vec!["127.0.0.1".to_owned(), "node3.example.com".to_owned(), "::1".to_owned()];
    create_node(&layout, 3, &hosts, false).unwrap();
    create_client(&layout, "alice", false).unwrap();
    assert_eq!(mode(&layout.node_key(3)), 0o600);
    assert_eq!(mode(&layout.client_key("alice")), 0o600);

    let ca = der(&layout.ca_cert());
    let node = der(&layout.node_cert(3));
    let client = der(&layout.client_cert("alice"));
    assert_eq!(identity_of(&node), Ok(Identity::Node(3)));
    assert_eq!(identity_of(&client), Ok(Identity::User("alice".into())));
    assert!(identity_of(&ca).is_err(), "the CA names no one");
    assert!(signed_by(&node, &ca) && signed_by(&client, &ca));

    let (_, parsed) = x509_parser::parse_x509_certificate(&node).unwrap();
    let sans = parsed.subject_alternative_name().unwrap().unwrap().value.general_names.clone();
    assert!(sans.contains(&GeneralName::DNSName("node3.example.com")));
    assert!(sans.contains(&GeneralName::IPAddress(&[127, 0, 0, 1])));
    let usages = parsed.extended_key_usage().unwrap().unwrap().value;
    assert!(usages.server_auth && usages.client_auth);
    let (_, ca_parsed) = x509_parser::parse_x509_certificate(&ca).unwrap();
    assert!(parsed.validity().not_after <= ca_parsed.validity().not_after, "outlives its CA");
    assert!(parsed.validity().not_before.timestamp() < OffsetDateTime::now_utc().unix_timestamp());

    let (_, parsed) = x509_parser::parse_x509_certificate(&client).unwrap();
    let usages = parsed.extended_key_usage().unwrap().unwrap().value;
    assert!(usages.client_auth && !usages.server_auth, "a client certificate can serve");
    assert_eq!(parsed.subject().iter_common_name().next().unwrap().as_str().unwrap(), "alice");
}

#[test]
fn nothing_is_overwritten_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(dir.path());
    create_ca(&layout, false).unwrap();
    let first = fs::read(layout.ca_cert()).unwrap();
    let err = create_ca(&layout, false).unwrap_err();
    assert!(matches!(&err, CertError::Exists { path } if *path == layout.ca_cert()), "{err}");
    assert!(err.to_string().contains("--overwrite"));
    assert_eq!(fs::read(layout.ca_cert()).unwrap(), first);
    create_client(&layout, "bob", false).unwrap();
    assert!(matches!(create_client(&layout, "bob", false), Err(CertError::Exists { .. })));
    create_client(&layout, "bob", true).unwrap();
    create_ca(&layout, true).unwrap();
    assert_ne!(fs::read(layout.ca_cert()).unwrap(), first);
}

#[test]
fn a_certificate_of_another_ca_does_not_verify() {
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (one, two) = (Layout::new(one.path()), Layout::new(two.path()));
    create_ca(&one, false).unwrap();
    create_ca(&two, false).unwrap();
    create_node(&two, 1, &["localhost".into()], false).unwrap();
    assert!(!signed_by(&der(&two.node_cert(1)), &der(&one.ca_cert())));
    assert!(signed_by(&der(&two.node_cert(1)), &der(&two.ca_cert())));
}

#[test]
fn a_missing_or_mismatched_ca_and_bad_names_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(dir.path());
    let err = create_node(&layout, 1, &["localhost".into()], false).unwrap_err();
    assert!(err.to_string().contains("ca.crt is missing: run `fencelock cert create-ca"), "{err}");

    create_ca(&layout, false).unwrap();
    for user in ["", "node", "a/b", "al ice", ".hidden", &"x".repeat(65), "é"] {
        assert!(matches!(create_client(&layout, user, false), Err(CertError::Name(_))), "user {user:?}");
    }
    assert!(matches!(create_node(&layout, 0, &["localhost".into()], false), Err(CertError::Name(_))));
    assert!(matches!(create_node(&layout, 1, &[], false), Err(CertError::Name(_))));
    for host in ["bad host", "-x.example", "a..b", ""] {
        assert!(
            matches!(create_node(&layout, 1, &[host.into()], false), Err(CertError::Name(_))),
            "{host:?}"
        );
    }

    // A CA key that is not the CA certificate's.
    let other = tempfile::tempdir().unwrap();
    let other = Layout::new(other.path());
    create_ca(&other, false).unwrap();
    fs::copy(other.ca_key(), layout.ca_key()).unwrap();
    let err = create_client(&layout, "carol", false).unwrap_err();
    assert!(err.to_string().contains("ca.key is not a usable CA key"), "{err}");
    fs::write(layout.ca_cert(), "garbage").unwrap();
    let err = create_client(&layout, "carol", false).unwrap_err();
    assert!(err.to_string().contains("ca.crt is not a usable CA certificate"), "{err}");
    assert!(!layout.client_cert("carol").exists());
}

/// Runs a handshake between two in-memory connections; `Err` with the
/// first side's error.
fn handshake(
    client: &mut rustls::ClientConnection,
    server: &mut rustls::ServerConnection,
) -> Result<(), String> {
    for _ in 0..20 {
        let mut bytes = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut bytes).unwrap();
        }
        if !bytes.is_empty() {
            server.read_tls(&mut bytes.as_slice()).unwrap();
            server.process_new_packets().map_err(|err| format!("server: {err}"))?;
        }
        let mut bytes = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut bytes).unwrap();
        }
        if !bytes.is_empty() {
            client.read_tls(&mut bytes.as_slice()).unwrap();
            client.process_new_packets().map_err(|err| format!("client: {err}"))?;
        }
        if !client.is_handshaking() && !server.is_handshaking() {
            // TLS 1.3: a refused client certificate reaches the client
            // only after its side is done; the server has it by now.
            return Ok(());
        }
    }
    Err("the handshake never finished".into())
}

fn connect(
    config: &std::sync::Arc<rustls::ClientConfig>,
    name: rustls::pki_types::ServerName<'static>,
    server: &std::sync::Arc<rustls::ServerConfig>,
) -> (Result<(), String>, rustls::ClientConnection, rustls::ServerConnection) {
    let mut client = rustls::ClientConnection::new(config.clone(), name).unwrap();
    let mut server = rustls::ServerConnection::new(server.clone()).unwrap();
    let result = handshake(&mut client, &mut server);
    (result, client, server)
}

fn ip(text: &str) -> rustls::pki_types::ServerName<'static> {
    rustls::pki_types::ServerName::try_from(text.to_owned()).unwrap()
}

/// A CA, nodes 1 to 3 (on 127.0.0.1) and users alice and bob.
fn cluster(dir: &Path) -> Layout {
    let layout = Layout::new(dir);
    create_ca(&layout, false).unwrap();
    for id in 1..=3 {
        create_node(&layout, id, &["127.0.0.1".into(), "localhost".into()], false).unwrap();
    }
    create_client(&layout, "alice", false).unwrap();
    create_client(&layout, "bob", false).unwrap();
    layout
}

#[test]
fn peers_know_each_other_by_node_id_and_clients_by_user() {
    let dir = tempfile::tempdir().unwrap();
    let layout = cluster(dir.path());
    let (one, two) = (node_tls(&layout, 1).unwrap(), node_tls(&layout, 2).unwrap());

    let (result, client, server) = connect(&one.peer_client, peer_server_name(2), &two.peer_server);
    assert_eq!(result, Ok(()));
    assert_eq!(peer_identity(&server), Some(Identity::Node(1)));
    assert_eq!(peer_identity(&client), Some(Identity::Node(2)));

    // Node 1 dials node 3's address but reaches node 2: refused.
    let (result, ..) = connect(&one.peer_client, peer_server_name(3), &two.peer_server);
    assert!(result.unwrap_err().contains("client"), "the dialler must refuse the wrong node");

    let alice = client_tls(&layout, "alice").unwrap();
    for name in ["127.0.0.1", "localhost"] {
        let (result, _, server) = connect(&alice, ip(name), &two.client_server);
        assert_eq!(result, Ok(()), "{name}");
        assert_eq!(peer_identity(&server), Some(Identity::User("alice".into())));
    }
    // An address the node's certificate does not list.
    let (result, ..) = connect(&alice, ip("127.0.0.2"), &two.client_server);
    assert!(result.is_err());
}

#[test]
fn a_user_on_the_peer_port_and_strangers_are_refused_and_a_node_on_the_client_port_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let layout = cluster(dir.path());
    let (one, two) = (node_tls(&layout, 1).unwrap(), node_tls(&layout, 2).unwrap());
    let alice = client_tls(&layout, "alice").unwrap();

    let (result, ..) = connect(&alice, peer_server_name(2), &two.peer_server);
    assert!(result.unwrap_err().starts_with("server"), "a user certificate passed the peer port");
    // A node on the client port is let in (`--join` calls as the node
    // itself); the node's handler lets it only join as itself.
    let (result, _, server) = connect(&one.peer_client, ip("127.0.0.1"), &two.client_server);
    assert_eq!(result, Ok(()));
    assert_eq!(peer_identity(&server), Some(Identity::Node(1)));
    let joiner = client_tls(&layout, &node_principal(3)).unwrap();
    let (result, _, server) = connect(&joiner, ip("127.0.0.1"), &two.client_server);
    assert_eq!(result, Ok(()));
    assert_eq!(peer_identity(&server), Some(Identity::Node(3)));
    assert_eq!(principal_node(&node_principal(3)), Some(3));
    assert_eq!(principal_node("node/0"), None);
    assert_eq!(principal_node("alice"), None);

    // Another cluster's CA, both ways.
    let other = tempfile::tempdir().unwrap();
    let other = cluster(other.path());
    let mallory = client_tls(&other, "alice").unwrap();
    let (result, ..) = connect(&mallory, ip("127.0.0.1"), &two.client_server);
    assert!(result.is_err(), "a client of another CA was let in");
    let impostor = node_tls(&other, 2).unwrap();
    let (result, ..) = connect(&alice, ip("127.0.0.1"), &impostor.client_server);
    assert!(result.unwrap_err().starts_with("client"), "the client trusted another CA's node");

    // No client certificate at all.
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der(&layout.ca_cert()).into()).unwrap();
    let anonymous = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let (result, ..) = connect(&std::sync::Arc::new(anonymous), ip("127.0.0.1"), &two.client_server);
    assert!(result.unwrap_err().starts_with("server"), "a client without a certificate was let in");
}

#[test]
fn a_ca_file_holding_two_cas_trusts_both_during_a_rotation() {
    let old_dir = tempfile::tempdir().unwrap();
    let old = cluster(old_dir.path());
    let new_dir = tempfile::tempdir().unwrap();
    // The new CA names the old one's cluster, as docs/security.md says to.
    let name = cluster_of(&der(&old.ca_cert())).unwrap().expect("the CA names a cluster");
    let new = Layout::new(new_dir.path());
    create_ca_named(&new, Some(&name), false).unwrap();
    for id in 1..=3 {
        create_node(&new, id, &["127.0.0.1".into(), "localhost".into()], false).unwrap();
    }
    create_client(&new, "alice", false).unwrap();
    // Node 2 trusts both: the old CA first (its own certificate is still
    // the old CA's), then the new one.
    let both = [std::fs::read(old.ca_cert()).unwrap(), std::fs::read(new.ca_cert()).unwrap()].concat();
    std::fs::write(old.ca_cert(), &both).unwrap();
    let two = node_tls(&old, 2).unwrap();
    for user_layout in [&old, &new] {
        let alice = client_tls(user_layout, "alice").unwrap();
        let (result, ..) = connect(&alice, ip("127.0.0.1"), &two.client_server);
        // The new CA's alice does not trust the old CA's node 2 yet: her
        // handshake fails on her side, not on node 2's.
        if std::ptr::eq(user_layout, &new) {
            assert!(result.unwrap_err().starts_with("client"));
        } else {
            assert_eq!(result, Ok(()));
        }
    }
    // Node 1 of the new CA, trusting both too, takes both CAs' users and
    // peers.
    std::fs::write(new.ca_cert(), &both).unwrap();
    let one = node_tls(&new, 1).unwrap();
    for user_layout in [&old, &new] {
        std::fs::write(user_layout.ca_cert(), &both).unwrap();
        let alice = client_tls(user_layout, "alice").unwrap();
        let (result, ..) = connect(&alice, ip("127.0.0.1"), &one.client_server);
        assert_eq!(result, Ok(()));
    }
    let (result, ..) = connect(&one.peer_client, peer_server_name(2), &two.peer_server);
    assert_eq!(result, Ok(()), "peers of the old and the new CA during the rotation");
    // Signing still uses the first CA, whose key is beside it.
    create_client(&old, "carol", false).unwrap();
    assert!(signed_by(&der(&old.client_cert("carol")), &der(&old_dir.path().join("ca.crt"))));
    // A file with a garbage second block is refused, naming it.
    std::fs::write(
        old.ca_cert(),
        [both.clone(), b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec()].concat(),
    )
    .unwrap();
    let err = node_tls(&old, 2).unwrap_err().to_string();
    assert!(err.contains("ca.crt") && err.contains("a later one"), "{err}");
}

#[test]
fn bad_files_are_refused_at_load_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let layout = cluster(dir.path());
    let message = |result: Result<NodeTls, CertError>| result.unwrap_err().to_string();

    // A certificate for another node.
    fs::copy(layout.node_cert(2), layout.node_cert(1)).unwrap();
    fs::copy(layout.node_key(2), layout.node_key(1)).unwrap();
    let err = message(node_tls(&layout, 1));
    assert!(err.contains("node-1.crt") && err.contains("names node 2, not node 1"), "{err}");

    // A key that is not the certificate's.
    create_node(&layout, 1, &["127.0.0.1".into()], true).unwrap();
    fs::copy(layout.node_key(3), layout.node_key(1)).unwrap();
    let err = message(node_tls(&layout, 1));
    assert!(err.contains("node-1.key") && err.contains("is not the key of"), "{err}");

    // A key others can read.
    create_node(&layout, 1, &["127.0.0.1".into()], true).unwrap();
    fs::set_permissions(layout.node_key(1), fs::Permissions::from_mode(0o644)).unwrap();
    let err = message(node_tls(&layout, 1));
    assert!(err.contains("node-1.key") && err.contains("chmod 600"), "{err}");

    // An unreadable key (a directory in its place: root reads any file).
    fs::remove_file(layout.node_key(1)).unwrap();
    fs::create_dir(layout.node_key(1)).unwrap();
    fs::set_permissions(layout.node_key(1), fs::Permissions::from_mode(0o700)).unwrap();
    let err = message(node_tls(&layout, 1));
    assert!(err.contains("node-1.key"), "{err}");
    fs::remove_dir(layout.node_key(1)).unwrap();

    // Garbage for a certificate.
    create_node(&layout, 1, &["127.0.0.1".into()], true).unwrap();
    fs::write(layout.node_cert(1), "not a certificate").unwrap();
    let err = message(node_tls(&layout, 1));
    assert!(err.contains("node-1.crt is not a usable node certificate"), "{err}");

    // A missing CA.
    create_node(&layout, 1, &["127.0.0.1".into()], true).unwrap();
    fs::remove_file(layout.ca_cert()).unwrap();
    let err = message(node_tls(&layout, 1));
    assert!(err.contains("ca.crt is missing"), "{err}");
    let err = client_tls(&layout, "alice").unwrap_err().to_string();
    assert!(err.contains("ca.crt is missing"), "{err}");
    let err = client_tls(&Layout::new(dir.path()), "nobody").unwrap_err().to_string();
    assert!(err.contains("missing"), "{err}");
}

#[test]
fn an_expired_certificate_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let layout = cluster(dir.path());
    // Re-sign alice's certificate with a validity that ended yesterday.
    let (issuer, _, _) = super::load_issuer(&layout).unwrap();
    let key = KeyPair::from_pem(&fs::read_to_string(layout.client_key("alice")).unwrap()).unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name = super::name("alice");
    params.subject_alt_names = vec![SanType::URI("fencelock://user/alice".try_into().unwrap())];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.not_before = OffsetDateTime::now_utc() - Duration::days(10);
    params.not_after = OffsetDateTime::now_utc() - Duration::days(1);
    let expired = params.signed_by(&key, &issuer).unwrap();
    fs::write(layout.client_cert("alice"), expired.pem()).unwrap();
    let err = client_tls(&layout, "alice").unwrap_err().to_string();
    assert!(err.contains("client-alice.crt") && err.contains("expired at"), "{err}");
}

/// A client configuration that presents `cert` and checks only that the
/// server's certificate is of the CA `ca` (not its cluster).
fn careless(ca: &Path, cert: &Path, key: &Path) -> std::sync::Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der(ca).into()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(vec![der(cert).into()], key)
    .unwrap();
    std::sync::Arc::new(config)
}

#[test]
fn a_node_of_another_cluster_signed_by_the_same_ca_is_refused_on_every_port() {
    let dir = tempfile::tempdir().unwrap();
    let ours = cluster(dir.path());
    let name = cluster_of(&der(&ours.ca_cert())).unwrap().expect("the CA names a cluster");
    // The same CA, signing for a second cluster with its own name.
    let other_dir = tempfile::tempdir().unwrap();
    let other = Layout::new(other_dir.path());
    std::fs::create_dir_all(other_dir.path()).unwrap();
    for file in ["ca.crt", "ca.key"] {
        std::fs::copy(dir.path().join(file), other_dir.path().join(file)).unwrap();
    }
    let hosts = ["127.0.0.1".to_owned()];
    create_node_for(&other, 1, &hosts, false, std::time::Duration::from_secs(3600), Some("other")).unwrap();
    create_client_for(&other, "alice", false, std::time::Duration::from_secs(3600), Some("other")).unwrap();
    assert_eq!(cluster_of(&der(&other.node_cert(1))).unwrap().as_deref(), Some("other"));
    assert_eq!(cluster_of(&der(&ours.node_cert(1))).unwrap(), Some(name.clone()));
    assert!(signed_by(&der(&other.node_cert(1)), &der(&ours.ca_cert())));

    let two = node_tls(&ours, 2).unwrap();
    assert_eq!(two.cluster.as_deref(), Some(name.as_str()));
    let impostor = node_tls(&other, 1).unwrap();
    // It dials our node 2 as node 1: refused (by itself first, as it
    // checks our certificate; then by our side, with a dialler that does
    // not check clusters).
    let (result, ..) = connect(&impostor.peer_client, peer_server_name(2), &two.peer_server);
    assert!(result.unwrap_err().contains("cluster"));
    let dialler = careless(&ours.ca_cert(), &other.node_cert(1), &other.node_key(1));
    let (result, ..) = connect(&dialler, peer_server_name(2), &two.peer_server);
    let err = result.unwrap_err();
    assert!(err.starts_with("server") && err.contains("`other`"), "{err}");
    // Our node 2 dials it as node 1: refused too.
    let (result, ..) = connect(&two.peer_client, peer_server_name(1), &impostor.peer_server);
    let err = result.unwrap_err();
    assert!(err.starts_with("client") && err.contains("`other`"), "{err}");
    // A client of ours sent to it (a forged redirect): refused.
    let alice = client_tls(&ours, "alice").unwrap();
    let (result, ..) = connect(&alice, ip("127.0.0.1"), &impostor.client_server);
    assert!(result.unwrap_err().starts_with("client"), "our client trusted the other cluster's node");
    // The other cluster's user at our client port: refused.
    let mallory = careless(&ours.ca_cert(), &other.client_cert("alice"), &other.client_key("alice"));
    let (result, ..) = connect(&mallory, ip("127.0.0.1"), &two.client_server);
    let err = result.unwrap_err();
    assert!(
        err.starts_with("server") && err.contains("`other`"),
        "the other cluster's user was let in: {err}"
    );
    // Ours still talk.
    let one = node_tls(&ours, 1).unwrap();
    let (result, ..) = connect(&one.peer_client, peer_server_name(2), &two.peer_server);
    assert_eq!(result, Ok(()));
    // And a bad name is refused before anything is written.
    let err =
        create_node_for(&other, 3, &hosts, false, std::time::Duration::from_secs(3600), Some("Bad/Name"))
            .unwrap_err();
    assert!(err.to_string().contains("cluster name"), "{err}");
    assert!(!other.node_cert(3).exists());
}
