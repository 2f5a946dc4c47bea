//! One job, one runner: an exclusive OS file lock beside the output (`<output>.dustoff.lock`)
//! held for the whole run. Two runs of one job at once (a cron overlap) would commit the same
//! records twice and delete each other's part files; the second is refused at once instead,
//! naming the pid that holds the lock.
//!
//! The lock is `flock(2)` (std's `File::try_lock`): the kernel drops it when the process dies,
//! so a `kill -9` never leaves a stale lock. The file holds the holder's pid, for the message
//! only. It is removed when the run ends; a run that finds the file unlocked takes it over.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "another dustoff run{} is working on {output}: it holds the lock {lock}; wait for it to end \
         or stop it (two runs of one job would write the same checkpoint)",
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    Held { output: PathBuf, lock: PathBuf, pid: Option<u32> },
    #[error("cannot take the lock {path} of this job's output: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// Held while it lives; dropping it removes the lock file and releases the lock.
#[derive(Debug)]
pub struct JobLock {
    file: File,
    path: PathBuf,
}

impl JobLock {
    /// The lock file of `output`.
    pub fn path_for(output: &Path) -> PathBuf {
        let mut p = output.as_os_str().to_owned();
        p.push(".dustoff.lock");
        PathBuf::from(p)
    }

    /// Takes the lock of `output`'s job, or says who holds it. Never waits.
    pub fn acquire(output: &Path) -> Result<JobLock, LockError> {
        let path = Self::path_for(output);
        let io = |source| LockError::Io { path: path.clone(), source };
        loop {
            let mut file =
                OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(io)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    let mut text = String::new();
                    let _ = file.read_to_string(&mut text);
                    let pid = text.trim().parse().ok();
                    return Err(LockError::Held { output: output.to_path_buf(), lock: path, pid });
                }
                Err(TryLockError::Error(e)) => return Err(io(e)),
            }
            // NOTE: a run that ended between our open and our lock removed the file; a third run
            // may then have made a new one and locked that. Our lock on the removed file would
            // exclude nobody: start again on whatever the path names now.
            if !same_file(&file, &path) {
                continue;
            }
            file.set_len(0)
                .and_then(|_| file.seek(SeekFrom::Start(0)))
                .and_then(|_| writeln!(file, "{}", std::process::id()))
                .map_err(io)?;
            return Ok(JobLock { file, path });
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for JobLock {
    fn drop(&mut self) {
        // Removed while still locked (the lock goes with the descriptor, closed after this), so
        // a run that opened the old file sees it is gone (`same_file`) and starts again.
        let _ = std::fs::remove_file(&self.path);
        let _ = self.file.unlock();
    }
}

#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_file: &File, path: &Path) -> bool {
    path.exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_with_the_pid_and_freed_on_drop() {
        let d = std::env::temp_dir().join(format!("dustoff-lock-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let out = d.join("out.jsonl");
        let a = JobLock::acquire(&out).unwrap();
        assert_eq!(std::fs::read_to_string(a.path()).unwrap().trim(), std::process::id().to_string());
        // flock locks belong to open file descriptions: a second open in this process conflicts
        // exactly as another process would.
        match JobLock::acquire(&out) {
            Err(LockError::Held { pid, lock, .. }) => {
                assert_eq!(pid, Some(std::process::id()));
                assert_eq!(lock, JobLock::path_for(&out));
            }
            other => panic!("second lock: {other:?}"),
        }
        drop(a);
        assert!(!JobLock::path_for(&out).exists(), "the lock file goes with the lock");
        // A lock file left by a killed run (no lock on it) is taken over.
        std::fs::write(JobLock::path_for(&out), "999999\n").unwrap();
        let b = JobLock::acquire(&out).unwrap();
        drop(b);
        let _ = std::fs::remove_dir_all(&d);
    }
}
