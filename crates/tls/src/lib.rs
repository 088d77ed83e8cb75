//! fencelock's certificates: a cluster CA, node certificates that name
//! their node id, client certificates that name their user, written to a
//! certificates directory in the layout `fencelock cert` and `--certs-dir`
//! share, and read back with errors that name the file.
//!
//! What it owns: the layout ([`Layout`]), making certificates
//! ([`create_ca`], [`create_node`], [`create_client`]), telling who a
//! certificate names ([`identity_of`]), and the rustls configurations built
//! from them ([`node_tls`], [`client_tls`]). What it does not own: sockets
//! and sessions; the network layer runs them.
//!
//! A node's certificate has CN `node`, the URI SAN `fencelock://node/<id>`,
//! the DNS SAN `node-<id>.fencelock` (what its peers ask for), a DNS or IP
//! SAN for each host it serves under, and both the server and client
//! extended key usages (it accepts connections and opens them). A
//! client's has CN `<user>`, the URI SAN `fencelock://user/<user>` and the
//! client usage only. The CA lives 10 years, the others 5 (never past the
//! CA); each starts a day in the past, to forgive clocks that lag. Keys are
//! ECDSA P-256, written with mode 0600.
//!
//! Every certificate also names its cluster, with the URI SAN
//! `fencelock://cluster/<name>`: the CA gets a name when it is made (one
//! drawn from its key unless one is given), and the certificates it signs
//! name the CA's cluster unless told another (a CA that serves several
//! clusters). A node whose certificate names a cluster takes only peers
//! whose certificates name the same one ([`node_tls`]); a certificate of
//! another cluster signed by the same CA is refused in the handshake.

use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use time::{Duration, OffsetDateTime};

mod config;

pub use config::{client_tls, node_tls, peer_identity, peer_server_name, NodeTls};

/// How long a CA lives.
pub const CA_LIFETIME: Duration = Duration::days(10 * 365);
/// How long a node or client certificate lives (never past its CA).
pub const LEAF_LIFETIME: Duration = Duration::days(5 * 365);
/// How far in the past a certificate starts.
const BACKDATE: Duration = Duration::days(1);

/// The URI SAN prefixes that say who a certificate is.
const NODE_URI: &str = "fencelock://node/";
const USER_URI: &str = "fencelock://user/";
/// The URI SAN prefix that says which cluster a certificate belongs to.
const CLUSTER_URI: &str = "fencelock://cluster/";

/// A certificate failure, naming the file or the name at fault.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} exists; pass --overwrite to replace it")]
    Exists { path: PathBuf },
    #[error("{path} is missing: run `fencelock cert create-ca --certs-dir {dir}` first")]
    NoCa { path: PathBuf, dir: String },
    #[error("{path} is missing")]
    Missing { path: PathBuf },
    #[error("{path} is not a usable {what}: {detail}")]
    Bad { path: PathBuf, what: &'static str, detail: String },
    #[error("{0}")]
    Name(String),
    #[error("cannot make the certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// Who a certificate names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    Node(u64),
    User(String),
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Identity::Node(id) => write!(f, "node {id}"),
            Identity::User(user) => write!(f, "user {user}"),
        }
    }
}

/// The files of a certificates directory.
#[derive(Clone, Debug)]
pub struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn new(dir: impl Into<PathBuf>) -> Layout {
        Layout { dir: dir.into() }
    }

    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    pub fn node_cert(&self, id: u64) -> PathBuf {
        self.dir.join(format!("node-{id}.crt"))
    }

    pub fn node_key(&self, id: u64) -> PathBuf {
        self.dir.join(format!("node-{id}.key"))
    }

    pub fn client_cert(&self, user: &str) -> PathBuf {
        self.dir.join(format!("client-{user}.crt"))
    }

    pub fn client_key(&self, user: &str) -> PathBuf {
        self.dir.join(format!("client-{user}.key"))
    }
}

/// Makes the cluster's CA: `ca.crt` and `ca.key`, naming a cluster drawn
/// from its key. Returns the files written.
pub fn create_ca(layout: &Layout, overwrite: bool) -> Result<Vec<PathBuf>, CertError> {
    create_ca_named(layout, None, overwrite)
}

/// [`create_ca`], naming the cluster `cluster` (checked with
/// [`check_cluster`]) when given. The certificates it signs name that
/// cluster unless told another.
pub fn create_ca_named(
    layout: &Layout,
    cluster: Option<&str>,
    overwrite: bool,
) -> Result<Vec<PathBuf>, CertError> {
    let (cert, key) = (layout.ca_cert(), layout.ca_key());
    refuse_existing(&[&cert, &key], overwrite)?;
    if let Some(cluster) = cluster {
        check_cluster(cluster)?;
    }
    let key_pair = KeyPair::generate()?;
    // Unnamed: 16 hex digits of the public key's X coordinate (after the
    // 0x04 of an uncompressed point), as random as the key.
    let drawn: String =
        key_pair.public_key_raw().iter().skip(1).take(8).map(|byte| format!("{byte:02x}")).collect();
    let cluster = cluster.map_or(drawn, str::to_owned);
    let mut params = CertificateParams::default();
    params.distinguished_name = name("fencelock CA");
    params.subject_alt_names = vec![SanType::URI(ia5(&format!("{CLUSTER_URI}{cluster}"))?)];
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + CA_LIFETIME;
    let certificate = params.self_signed(&key_pair)?;
    create_dir(&layout.dir)?;
    write_file(&key, key_pair.serialize_pem().as_bytes(), 0o600)?;
    write_file(&cert, certificate.pem().as_bytes(), 0o644)?;
    Ok(vec![cert, key])
}

/// Makes node `id`'s certificate, for the host names and addresses it
/// serves under, signed by the directory's CA, valid for [`LEAF_LIFETIME`].
pub fn create_node(
    layout: &Layout,
    id: u64,
    hosts: &[String],
    overwrite: bool,
) -> Result<Vec<PathBuf>, CertError> {
    create_node_for(layout, id, hosts, overwrite, LEAF_LIFETIME.unsigned_abs(), None)
}

/// [`create_node`], valid for `lifetime` (never past the CA), naming the
/// cluster `cluster` when given (else the CA's).
pub fn create_node_for(
    layout: &Layout,
    id: u64,
    hosts: &[String],
    overwrite: bool,
    lifetime: std::time::Duration,
    cluster: Option<&str>,
) -> Result<Vec<PathBuf>, CertError> {
    if id == 0 {
        return Err(CertError::Name("node ids start at 1".into()));
    }
    if hosts.is_empty() {
        return Err(CertError::Name(
            "name at least one host (a DNS name or an IP address) the node serves under".into(),
        ));
    }
    let mut sans = vec![
        SanType::URI(ia5(&format!("{NODE_URI}{id}"))?),
        SanType::DnsName(ia5(&format!("node-{id}.fencelock"))?),
    ];
    for host in hosts {
        sans.push(match host.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => {
                check_dns_name(host)?;
                SanType::DnsName(ia5(host)?)
            }
        });
    }
    let usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let leaf = Leaf {
        cert: layout.node_cert(id),
        key: layout.node_key(id),
        common_name: "node",
        sans,
        usages,
        cluster,
    };
    create_leaf(layout, leaf, overwrite, lifetime)
}

/// Makes user `user`'s client certificate, signed by the directory's CA,
/// valid for [`LEAF_LIFETIME`].
pub fn create_client(layout: &Layout, user: &str, overwrite: bool) -> Result<Vec<PathBuf>, CertError> {
    create_client_for(layout, user, overwrite, LEAF_LIFETIME.unsigned_abs(), None)
}

/// [`create_client`], valid for `lifetime` (never past the CA), naming the
/// cluster `cluster` when given (else the CA's).
pub fn create_client_for(
    layout: &Layout,
    user: &str,
    overwrite: bool,
    lifetime: std::time::Duration,
    cluster: Option<&str>,
) -> Result<Vec<PathBuf>, CertError> {
    check_user(user)?;
    let sans = vec![SanType::URI(ia5(&format!("{USER_URI}{user}"))?)];
    let usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let leaf = Leaf {
        cert: layout.client_cert(user),
        key: layout.client_key(user),
        common_name: user,
        sans,
        usages,
        cluster,
    };
    create_leaf(layout, leaf, overwrite, lifetime)
}

/// When the certificate in `der` stops being valid, `None` if it does not
/// parse. Connections are closed then: a handshake checks a certificate
/// once, and a connection could otherwise outlive it.
pub fn not_after_of(der: &[u8]) -> Option<std::time::SystemTime> {
    let (_, parsed) = x509_parser::parse_x509_certificate(der).ok()?;
    let seconds = parsed.validity().not_after.timestamp();
    let seconds = u64::try_from(seconds).ok()?;
    std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(seconds))
}

/// Who the certificate in `der` names, from its fencelock URI SAN.
pub fn identity_of(der: &[u8]) -> Result<Identity, String> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).map_err(|err| err.to_string())?;
    let sans = certificate
        .subject_alternative_name()
        .map_err(|err| err.to_string())?
        .map(|extension| extension.value.general_names.clone())
        .unwrap_or_default();
    for san in sans {
        let x509_parser::extensions::GeneralName::URI(uri) = san else { continue };
        if let Some(id) = uri.strip_prefix(NODE_URI) {
            let id: u64 = id.parse().map_err(|_| format!("node URI {uri} has no number"))?;
            return Ok(Identity::Node(id));
        }
        if let Some(user) = uri.strip_prefix(USER_URI) {
            check_user(user).map_err(|err| err.to_string())?;
            return Ok(Identity::User(user.to_owned()));
        }
    }
    Err("the certificate names no fencelock node or user (no fencelock:// URI)".into())
}

/// The cluster the certificate in `der` names, from its
/// `fencelock://cluster/` URI SAN: `None` when it names none (made before
/// clusters had names), an error when it does not parse or names a bad one.
pub fn cluster_of(der: &[u8]) -> Result<Option<String>, String> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).map_err(|err| err.to_string())?;
    cluster_of_parsed(&certificate)
}

/// [`cluster_of`] for the first certificate of a PEM file's bytes; `None`
/// when it names none or does not parse.
pub fn cluster_of_pem(pem: &[u8]) -> Option<String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    cluster_of(&pem.contents).ok().flatten()
}

fn cluster_of_parsed(
    certificate: &x509_parser::certificate::X509Certificate<'_>,
) -> Result<Option<String>, String> {
    let sans = certificate
        .subject_alternative_name()
        .map_err(|err| err.to_string())?
        .map(|extension| extension.value.general_names.clone())
        .unwrap_or_default();
    let mut named = None;
    for san in sans {
        let x509_parser::extensions::GeneralName::URI(uri) = san else { continue };
        if let Some(cluster) = uri.strip_prefix(CLUSTER_URI) {
            check_cluster(cluster).map_err(|err| err.to_string())?;
            if named.is_some() {
                return Err("the certificate names two clusters".into());
            }
            named = Some(cluster.to_owned());
        }
    }
    Ok(named)
}

/// Checks a cluster name: 1 to 64 of lowercase letters, digits, `.`, `_`
/// and `-`, starting with a letter or a digit.
pub fn check_cluster(cluster: &str) -> Result<(), CertError> {
    let fine = (1..=64).contains(&cluster.len())
        && cluster.bytes().all(|byte| {
            byte.is_ascii_lowercase() || byte.is_ascii_digit() || matches!(byte, b'.' | b'_' | b'-')
        })
        && cluster.bytes().next().is_some_and(|byte| byte.is_ascii_alphanumeric());
    if fine {
        Ok(())
    } else {
        Err(CertError::Name(format!(
            "cluster name `{cluster}` must be 1 to 64 lowercase letters, digits, `.`, `_` or `-`, starting with a letter or a digit"
        )))
    }
}

/// The principal a node's certificate stands for on the client port:
/// `node/<id>`. No user name has a `/`, so it is never a user's.
pub fn node_principal(id: u64) -> String {
    format!("node/{id}")
}

/// The node a principal of [`node_principal`]'s form names.
pub fn principal_node(principal: &str) -> Option<u64> {
    principal.strip_prefix("node/")?.parse().ok().filter(|id| *id != 0)
}

/// Checks a user name: 1 to 64 of letters, digits, `.`, `_` and `-`,
/// not `node` (a lock owner is `user` or `user/suffix`, so no `/`).
pub fn check_user(user: &str) -> Result<(), CertError> {
    let fine = (1..=64).contains(&user.len())
        && user.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
        && !user.starts_with('.')
        && user != "node";
    if fine {
        Ok(())
    } else {
        Err(CertError::Name(format!(
            "user name `{user}` must be 1 to 64 letters, digits, `.`, `_` or `-`, not start with `.`, and not be `node`"
        )))
    }
}

fn check_dns_name(host: &str) -> Result<(), CertError> {
    let fine = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if fine {
        Ok(())
    } else {
        Err(CertError::Name(format!("host `{host}` is neither an IP address nor a DNS name")))
    }
}

/// A node or client certificate to make: its files and what it names.
struct Leaf<'a> {
    cert: PathBuf,
    key: PathBuf,
    common_name: &'a str,
    sans: Vec<SanType>,
    usages: Vec<ExtendedKeyUsagePurpose>,
    /// The cluster it names, if not the CA's.
    cluster: Option<&'a str>,
}

fn create_leaf(
    layout: &Layout,
    leaf: Leaf<'_>,
    overwrite: bool,
    lifetime: std::time::Duration,
) -> Result<Vec<PathBuf>, CertError> {
    let Leaf { cert, key, common_name, mut sans, usages, cluster } = leaf;
    if let Some(cluster) = cluster {
        check_cluster(cluster)?;
    }
    let lifetime = Duration::try_from(lifetime)
        .ok()
        .filter(|lifetime| *lifetime > Duration::ZERO && *lifetime <= CA_LIFETIME)
        .ok_or_else(|| {
            CertError::Name("a certificate's lifetime must be more than 0 and at most 10 years".into())
        })?;
    refuse_existing(&[&cert, &key], overwrite)?;
    let (issuer, ca_not_after, ca_cluster) = load_issuer(layout)?;
    // A CA made before clusters had names names none: its certificates
    // then name one only when told.
    if let Some(cluster) = cluster.map(str::to_owned).or(ca_cluster) {
        sans.push(SanType::URI(ia5(&format!("{CLUSTER_URI}{cluster}"))?));
    }
    let mut params = CertificateParams::default();
    params.distinguished_name = name(common_name);
    params.subject_alt_names = sans;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = usages;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = (now + lifetime).min(ca_not_after);
    let key_pair = KeyPair::generate()?;
    let certificate = params.signed_by(&key_pair, &issuer)?;
    write_file(&key, key_pair.serialize_pem().as_bytes(), 0o600)?;
    write_file(&cert, certificate.pem().as_bytes(), 0o644)?;
    Ok(vec![cert, key])
}

/// The directory's CA, to sign with, when it expires, and the cluster it
/// names (none for a CA made before clusters had names).
fn load_issuer(
    layout: &Layout,
) -> Result<(Issuer<'static, KeyPair>, OffsetDateTime, Option<String>), CertError> {
    let (cert_path, key_path) = (layout.ca_cert(), layout.ca_key());
    for path in [&cert_path, &key_path] {
        if !path.exists() {
            return Err(CertError::NoCa { path: path.clone(), dir: layout.dir.display().to_string() });
        }
    }
    let cert_pem = read(&cert_path)?;
    let key_pem = read(&key_path)?;
    let bad = |path: &Path, what: &'static str, detail: String| CertError::Bad {
        path: path.to_owned(),
        what,
        detail,
    };
    let key = KeyPair::from_pem(&key_pem).map_err(|err| bad(&key_path, "CA key", err.to_string()))?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
        .map_err(|err| bad(&cert_path, "CA certificate", err.to_string()))?;
    let parsed = pem.parse_x509().map_err(|err| bad(&cert_path, "CA certificate", err.to_string()))?;
    if !parsed.is_ca() {
        return Err(bad(&cert_path, "CA certificate", "it is not a CA".into()));
    }
    if parsed.public_key().raw != key.subject_public_key_info().as_slice() {
        return Err(bad(&key_path, "CA key", format!("it is not the key of {}", cert_path.display())));
    }
    let not_after = parsed.validity().not_after.to_datetime();
    if not_after <= OffsetDateTime::now_utc() {
        return Err(bad(&cert_path, "CA certificate", format!("it expired at {not_after}")));
    }
    let cluster = cluster_of_parsed(&parsed).map_err(|detail| bad(&cert_path, "CA certificate", detail))?;
    let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)
        .map_err(|err| bad(&cert_path, "CA certificate", err.to_string()))?;
    Ok((issuer, not_after, cluster))
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

fn ia5(text: &str) -> Result<rcgen::string::Ia5String, CertError> {
    text.try_into().map_err(|_| CertError::Name(format!("`{text}` is not plain ASCII")))
}

fn refuse_existing(paths: &[&PathBuf], overwrite: bool) -> Result<(), CertError> {
    match paths.iter().find(|path| path.exists()) {
        Some(path) if !overwrite => Err(CertError::Exists { path: (*path).clone() }),
        _ => Ok(()),
    }
}

fn create_dir(dir: &Path) -> Result<(), CertError> {
    fs::create_dir_all(dir).map_err(|source| CertError::Io { path: dir.to_owned(), source })
}

fn read(path: &Path) -> Result<String, CertError> {
    fs::read_to_string(path).map_err(|source| CertError::Io { path: path.to_owned(), source })
}

/// Writes `bytes` to `path` with `mode`, whole or not at all: into a new
/// file beside it, synced, then renamed over it.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CertError> {
    let io = |source| CertError::Io { path: path.to_owned(), source };
    let file_name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let temporary = path.with_file_name(format!(".{file_name}.new"));
    // A leftover from an interrupted run is ours to replace.
    let _ = fs::remove_file(&temporary);
    let mut file =
        fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&temporary).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)?;
    drop(file);
    fs::rename(&temporary, path).map_err(io)
}

#[cfg(test)]
mod tests;
