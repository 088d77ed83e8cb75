//! `fencelock snapshot save FILE`: a backup of the lock table, written
//! whole or not at all.
//!
//! The client fetches a consistent copy from the leader and checks it
//! (`Client::backup`); it goes into a temporary file beside FILE, which is
//! synced, then put in place (never over an existing file unless `--force`)
//! and the directory synced. `fencelockd --restore FILE` seeds a new
//! cluster from it (docs/operations.md, "Back up" and "Restore").

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use fencelock_client::BackupInfo;
use serde_json::json;

use crate::args::{Cli, SaveArgs, SnapshotCommand};
use crate::commands::{connect, print_json};
use crate::output::Exit;

pub fn run(cli: &Cli, command: &SnapshotCommand) -> Result<Exit> {
    match command {
        SnapshotCommand::Save(args) => save(cli, args),
    }
}

fn save(cli: &Cli, args: &SaveArgs) -> Result<Exit> {
    let path = &args.file;
    if !args.force && path.exists() {
        bail!("{} exists; pass --force to replace it", path.display());
    }
    let client = connect(cli)?;
    let partial = Partial::create(path)?;
    let mut out = Recording { inner: BufWriter::new(&partial.file), error: None };
    let info = match client.backup(&mut out) {
        Ok(info) => info,
        // A failed write is ours, not the cluster's: say which.
        Err(err) => match out.error.take() {
            Some(io) => return Err(io).with_context(|| format!("cannot write {}", partial.path.display())),
            None => return Err(err).context("cannot save a backup"),
        },
    };
    drop(out);
    partial.finish(path, args.force)?;
    if cli.json {
        print_json(&save_json(path, &info));
    } else {
        println!(
            "saved {}: {} locks, last token {}, index {}, {} bytes",
            path.display(),
            info.locks,
            info.last_token,
            info.index,
            info.bytes
        );
    }
    Ok(Exit::Done)
}

fn save_json(path: &Path, info: &BackupInfo) -> serde_json::Value {
    json!({
        "file": path.display().to_string(),
        "locks": info.locks,
        "last_token": info.last_token,
        "index": info.index,
        "bytes": info.bytes,
    })
}

/// A writer that keeps the error of a failed write, which the client only
/// names in its own error.
struct Recording<W> {
    inner: W,
    error: Option<io::Error>,
}

impl<W: Write> Write for Recording<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.inner
            .write(bytes)
            .inspect_err(|err| self.error = Some(io::Error::new(err.kind(), err.to_string())))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush().inspect_err(|err| self.error = Some(io::Error::new(err.kind(), err.to_string())))
    }
}

/// The temporary file a backup is written to, beside its final place;
/// removed unless it was put in place.
struct Partial {
    path: PathBuf,
    file: File,
    placed: bool,
}

impl Partial {
    fn create(target: &Path) -> Result<Partial> {
        let name = target.file_name().with_context(|| format!("{} names no file", target.display()))?;
        let mut partial_name = std::ffi::OsString::from(".");
        partial_name.push(name);
        partial_name.push(format!(".partial-{}", std::process::id()));
        let path = target.with_file_name(partial_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(Partial { path, file, placed: false })
    }

    /// Syncs the file and puts it at `target` (replacing a file there only
    /// with `force`), then syncs the directory.
    fn finish(mut self, target: &Path, force: bool) -> Result<()> {
        self.file.sync_all().with_context(|| format!("cannot sync {}", self.path.display()))?;
        if force {
            std::fs::rename(&self.path, target)
                .with_context(|| format!("cannot rename {} to {}", self.path.display(), target.display()))?;
        } else {
            // A link fails if the target exists, whoever made it meanwhile.
            match std::fs::hard_link(&self.path, target) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                    bail!("{} exists; pass --force to replace it", target.display())
                }
                // A file system without hard links: the check before the
                // backup started stands.
                Err(_) if !target.exists() => std::fs::rename(&self.path, target).with_context(|| {
                    format!("cannot rename {} to {}", self.path.display(), target.display())
                })?,
                Err(err) => return Err(err).with_context(|| format!("cannot write {}", target.display())),
            }
        }
        self.placed = true;
        // The link left the temporary name behind (the rename did not).
        let _ = std::fs::remove_file(&self.path);
        let dir = match target.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|dir| dir.sync_all())
            .with_context(|| format!("cannot sync {}", dir.display()))
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.placed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_file_is_put_in_place_whole_and_never_over_another_without_force() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("backup.flkt");
        let partial = Partial::create(&target).unwrap();
        (&partial.file).write_all(b"first").unwrap();
        let partial_path = partial.path.clone();
        partial.finish(&target, false).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"first");
        assert!(!partial_path.exists());

        let partial = Partial::create(&target).unwrap();
        (&partial.file).write_all(b"second").unwrap();
        let partial_path = partial.path.clone();
        let refused = partial.finish(&target, false).unwrap_err();
        assert!(format!("{refused:#}").contains("exists; pass --force"), "{refused:#}");
        assert_eq!(std::fs::read(&target).unwrap(), b"first");
        assert!(!partial_path.exists(), "a refused backup leaves nothing behind");

        let partial = Partial::create(&target).unwrap();
        (&partial.file).write_all(b"third").unwrap();
        partial.finish(&target, true).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"third");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn an_unfinished_file_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let partial = Partial::create(&dir.path().join("b")).unwrap();
        drop(partial);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn the_json_names_every_field() {
        let info = BackupInfo { index: 9, last_token: 17, locks: 3, bytes: 120 };
        assert_eq!(
            save_json(Path::new("b.flkt"), &info),
            json!({"file": "b.flkt", "locks": 3, "last_token": 17, "index": 9, "bytes": 120})
        );
    }
}
