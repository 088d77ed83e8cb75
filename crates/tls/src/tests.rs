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
