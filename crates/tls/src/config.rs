//! rustls configurations built from a certificates directory: what a node
//! needs on its two ports and toward its peers, and what a client needs.
//! TLS 1.3 only, with ring's primitives.
//!
//! - The peer port takes only node certificates of the cluster's CA; the
//!   node's network layer then holds the connection to the node id the
//!   certificate names.
//! - A side whose certificate names its cluster (`fencelock://cluster/`)
//!   refuses, on every port and either way, a certificate that names
//!   another cluster: a node of another cluster signed by the same CA
//!   fails the handshake. One that names none (made before clusters had
//!   names) passes; the node's hello rules still hold it to the cluster.
//! - Toward a peer, a node presents its own certificate and accepts only
//!   the certificate of the node it dialled: it asks for the name
//!   `node-<id>.fencelock`, which only that node's certificate carries.
//! - The client port takes user certificates of the cluster's CA, and
//!   node certificates (a node that joins with `--join` calls as itself;
//!   the node's handler lets it do only that).
//! - A client checks the node's certificate against the address it dialled
//!   (an IP or DNS name the node's certificate lists) and presents its
//!   user's certificate.
//!
//! Every file is checked when loaded: present, readable, parsable, not
//! expired, a key that matches its certificate and that no one else can
//! read, and a certificate that names the node or user it is loaded for.
//! Each error names the file.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    ClientConfig, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use time::OffsetDateTime;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};

use crate::{cluster_of, identity_of, CertError, Identity, Layout};

/// What a node runs TLS with.
#[derive(Clone, Debug)]
pub struct NodeTls {
    pub id: u64,
    /// Accepts peers: node certificates of the cluster's CA only.
    pub peer_server: Arc<ServerConfig>,
    /// Dials peers, as node `id`; see [`peer_server_name`].
    pub peer_client: Arc<ClientConfig>,
    /// Accepts clients: user and node certificates of the cluster's CA.
    pub client_server: Arc<ServerConfig>,
    /// When this node's certificate expires.
    pub not_after: OffsetDateTime,
    /// The cluster its certificate names, if any.
    pub cluster: Option<String>,
}

/// The name a node asks for when it dials peer `id`.
pub fn peer_server_name(id: u64) -> ServerName<'static> {
    // Digits, letters, a dash and a dot: always a DNS name.
    ServerName::try_from(format!("node-{id}.fencelock")).expect("node-N.fencelock is a DNS name")
}

/// Who is at the other end of a finished handshake, by its certificate.
pub fn peer_identity(connection: &rustls::CommonState) -> Option<Identity> {
    let end_entity = connection.peer_certificates()?.first()?;
    identity_of(end_entity).ok()
}

/// Loads what node `id` needs from `layout`: `ca.crt`, `node-<id>.crt` and
/// `node-<id>.key`.
pub fn node_tls(layout: &Layout, id: u64) -> Result<NodeTls, CertError> {
    let roots = load_roots(layout)?;
    let (chain, key, not_after) =
        load_identity(&layout.node_cert(id), &layout.node_key(id), &Identity::Node(id), "node certificate")?;
    let provider = provider();
    let bad_config =
        |detail: String| CertError::Bad { path: layout.node_cert(id), what: "node certificate", detail };
    let cluster = named_cluster(&chain).map_err(bad_config)?;

    let nodes_only =
        RequireIdentity::new(&roots, &provider, Kind::Node, cluster.clone()).map_err(bad_config)?;
    let peer_server = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|err| bad_config(err.to_string()))?
        .with_client_cert_verifier(Arc::new(nodes_only))
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(|err| bad_config(err.to_string()))?;

    let servers = WebPkiServerVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
        .build()
        .map_err(|err| bad_config(err.to_string()))?;
    let servers = Arc::new(RequireCluster { inner: servers, cluster: cluster.clone() });
    let peer_client = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|err| bad_config(err.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(servers)
        .with_client_auth_cert(chain.clone(), key.clone_key())
        .map_err(|err| bad_config(err.to_string()))?;

    let users_only =
        RequireIdentity::new(&roots, &provider, Kind::User, cluster.clone()).map_err(bad_config)?;
    let client_server = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|err| bad_config(err.to_string()))?
        .with_client_cert_verifier(Arc::new(users_only))
        .with_single_cert(chain, key)
        .map_err(|err| bad_config(err.to_string()))?;

    Ok(NodeTls {
        id,
        peer_server: Arc::new(peer_server),
        peer_client: Arc::new(peer_client),
        client_server: Arc::new(client_server),
        not_after,
        cluster,
    })
}

/// Loads what user `user` needs to reach the cluster from `layout`:
/// `ca.crt`, `client-<user>.crt` and `client-<user>.key`. The user
/// `node/<id>` ([`crate::node_principal`]) is node `id`, with its own
/// `node-<id>.crt` and `.key`: what a node joining with `--join` uses,
/// which a node only lets join as itself.
pub fn client_tls(layout: &Layout, user: &str) -> Result<Arc<ClientConfig>, CertError> {
    let (cert_path, key_path, who, what) = match crate::principal_node(user) {
        Some(id) => (layout.node_cert(id), layout.node_key(id), Identity::Node(id), "node certificate"),
        None => {
            crate::check_user(user)?;
            (
                layout.client_cert(user),
                layout.client_key(user),
                Identity::User(user.to_owned()),
                "client certificate",
            )
        }
    };
    let roots = load_roots(layout)?;
    let (chain, key, _) = load_identity(&cert_path, &key_path, &who, what)?;
    let bad_config = |detail: String| CertError::Bad { path: cert_path.clone(), what, detail };
    let cluster = named_cluster(&chain).map_err(bad_config)?;
    let provider = provider();
    let servers = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
        .build()
        .map_err(|err| bad_config(err.to_string()))?;
    let servers = Arc::new(RequireCluster { inner: servers, cluster });
    let config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|err| bad_config(err.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(servers)
        .with_client_auth_cert(chain, key)
        .map_err(|err| bad_config(err.to_string()))?;
    Ok(Arc::new(config))
}

/// The cluster the first certificate of `chain` names.
fn named_cluster(chain: &[CertificateDer<'static>]) -> Result<Option<String>, String> {
    match chain.first() {
        Some(der) => cluster_of(der),
        None => Ok(None),
    }
}

/// Whether a certificate's cluster fits a side whose own certificate
/// names `ours`: refused only when both name one and they differ. A
/// certificate that names none was made before clusters had names (or
/// while a CA that names none is rotated out); the network layer's hello
/// rules still hold it to the cluster's id.
fn cluster_fits(ours: Option<&str>, theirs: &[u8]) -> Result<(), rustls::Error> {
    let Some(ours) = ours else { return Ok(()) };
    match cluster_of(theirs) {
        Ok(Some(theirs)) if theirs != ours => Err(rustls::Error::General(format!(
            "the certificate is of cluster `{theirs}`, this side's of `{ours}`"
        ))),
        Ok(_) => Ok(()),
        Err(detail) => Err(rustls::Error::General(format!("the certificate's cluster: {detail}"))),
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load_roots(layout: &Layout) -> Result<Arc<RootCertStore>, CertError> {
    let path = layout.ca_cert();
    if !path.exists() {
        return Err(CertError::Missing { path });
    }
    // Every certificate in the file is trusted: during a CA rotation it
    // holds the old CA and the new one (docs/security.md).
    let pem = fs::read(&path).map_err(|source| CertError::Io { path: path.clone(), source })?;
    let mut roots = RootCertStore::empty();
    for (n, block) in x509_parser::pem::Pem::iter_from_buffer(&pem).enumerate() {
        let what = if n == 0 { "CA certificate" } else { "CA certificate (a later one in the file)" };
        let block = block.map_err(|err| CertError::Bad {
            path: path.clone(),
            what,
            detail: format!("not PEM: {err}"),
        })?;
        let (der, _) = check_certificate(&path, what, &block)?;
        roots.add(der).map_err(|err| CertError::Bad { path: path.clone(), what, detail: err.to_string() })?;
    }
    if roots.is_empty() {
        return Err(CertError::Bad {
            path,
            what: "CA certificate",
            detail: "it holds no certificate".into(),
        });
    }
    Ok(Arc::new(roots))
}

/// A certificate and its key, checked to name `who`.
fn load_identity(
    cert_path: &Path,
    key_path: &Path,
    who: &Identity,
    what: &'static str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>, OffsetDateTime), CertError> {
    for path in [cert_path, key_path] {
        if !path.exists() {
            return Err(CertError::Missing { path: path.to_owned() });
        }
    }
    let (der, not_after) = load_certificate(cert_path, what)?;
    let bad = |path: &Path, what: &'static str, detail: String| CertError::Bad {
        path: path.to_owned(),
        what,
        detail,
    };
    match identity_of(&der) {
        Ok(named) if named == *who => {}
        Ok(named) => return Err(bad(cert_path, what, format!("it names {named}, not {who}"))),
        Err(detail) => return Err(bad(cert_path, what, detail)),
    }
    let metadata =
        fs::metadata(key_path).map_err(|source| CertError::Io { path: key_path.to_owned(), source })?;
    if metadata.permissions().mode() & 0o077 != 0 {
        return Err(bad(
            key_path,
            "key",
            format!("others can read it (mode {:o}): chmod 600 it", metadata.permissions().mode() & 0o777),
        ));
    }
    let pem = fs::read(key_path).map_err(|source| CertError::Io { path: key_path.to_owned(), source })?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|err| bad(key_path, "key", err.to_string()))?;
    let signing = provider()
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|err| bad(key_path, "key", err.to_string()))?;
    let matches = signing.public_key().is_some_and(|public| {
        x509_parser::parse_x509_certificate(&der)
            .is_ok_and(|(_, parsed)| parsed.public_key().raw == public.as_ref())
    });
    if !matches {
        return Err(bad(key_path, "key", format!("it is not the key of {}", cert_path.display())));
    }
    Ok((vec![der], key, not_after))
}

/// One PEM certificate, checked to be valid now; with when it expires.
fn load_certificate(
    path: &Path,
    what: &'static str,
) -> Result<(CertificateDer<'static>, OffsetDateTime), CertError> {
    let pem = fs::read(path).map_err(|source| CertError::Io { path: path.to_owned(), source })?;
    let bad = |detail: String| CertError::Bad { path: path.to_owned(), what, detail };
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).map_err(|err| bad(format!("not PEM: {err}")))?;
    check_certificate(path, what, &pem)
}

/// A PEM block checked to be a certificate valid now; with when it expires.
fn check_certificate(
    path: &Path,
    what: &'static str,
    pem: &x509_parser::pem::Pem,
) -> Result<(CertificateDer<'static>, OffsetDateTime), CertError> {
    let bad = |detail: String| CertError::Bad { path: path.to_owned(), what, detail };
    let parsed = pem.parse_x509().map_err(|err| bad(format!("not a certificate: {err}")))?;
    let validity = parsed.validity();
    let now = OffsetDateTime::now_utc();
    let (not_before, not_after) = (validity.not_before.to_datetime(), validity.not_after.to_datetime());
    if not_after <= now {
        return Err(bad(format!("it expired at {not_after}")));
    }
    if not_before > now {
        return Err(bad(format!("it is not valid before {not_before}")));
    }
    Ok((CertificateDer::from(pem.contents.clone()), not_after))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Node,
    User,
}

/// The cluster CA's client-certificate check, and two more: the
/// certificate names a node (the peer port) or a user (the client port),
/// and the same cluster as this node's own (see the module doc).
#[derive(Debug)]
struct RequireIdentity {
    inner: Arc<dyn ClientCertVerifier>,
    kind: Kind,
    cluster: Option<String>,
}

impl RequireIdentity {
    fn new(
        roots: &Arc<RootCertStore>,
        provider: &Arc<CryptoProvider>,
        kind: Kind,
        cluster: Option<String>,
    ) -> Result<RequireIdentity, String> {
        let inner = WebPkiClientVerifier::builder_with_provider(Arc::clone(roots), Arc::clone(provider))
            .build()
            .map_err(|err| err.to_string())?;
        Ok(RequireIdentity { inner, kind, cluster })
    }
}

impl ClientCertVerifier for RequireIdentity {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        let fits = match identity_of(end_entity) {
            // Either port: a peer, or a node that joins as itself on the
            // client port.
            Ok(Identity::Node(_)) => true,
            Ok(Identity::User(_)) => self.kind == Kind::User,
            Err(_) => false,
        };
        if !fits {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ));
        }
        cluster_fits(self.cluster.as_deref(), end_entity)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The cluster CA's server-certificate check (the name dialled), and one
/// more: the certificate names the same cluster as this side's own.
#[derive(Debug)]
struct RequireCluster {
    inner: Arc<WebPkiServerVerifier>,
    cluster: Option<String>,
}

impl ServerCertVerifier for RequireCluster {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified =
            self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)?;
        cluster_fits(self.cluster.as_deref(), end_entity)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
