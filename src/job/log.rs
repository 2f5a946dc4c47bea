//! Log lines of unattended runs: when stderr is not a terminal (cron, systemd, a scheduler's
//! log file) every line `dustoff run` (and `generate --input`) writes to stderr gets a UTC
//! wall-clock timestamp in front; `--log-file PATH` appends the same lines, each with its timestamp, to a file.
//!
//! Every message of the run (ours, the libraries', a panic's) goes through file descriptor 2,
//! so the tee works there: fd 2 becomes the write end of a pipe, and a thread reads it line by
//! line and writes each line to the original stderr and to the log file. [`LogTee`]'s drop puts
//! the original stderr back, which closes the pipe, and waits for the thread to write the
//! last lines. (A second Ctrl-C exits at once and may lose the last lines of the log.)

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::FromRawFd;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("cannot open the log file {path}: {source}")]
    Open { path: PathBuf, source: std::io::Error },
    #[error("cannot redirect stderr through the log: {0}")]
    Redirect(std::io::Error),
}

/// The timestamp at the start of a log line: UTC, to the second (`2026-12-03T15:20:07Z`).
pub fn timestamp() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The line as written: `stamp` and a space in front when given, a newline at the end.
fn stamped(stamp: Option<&str>, line: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len() + 22);
    if let Some(s) = stamp {
        out.extend_from_slice(s.as_bytes());
        out.push(b' ');
    }
    out.extend_from_slice(line);
    if out.last() != Some(&b'\n') {
        out.push(b'\n');
    }
    out
}

/// Stderr running through the log (see the module). Dropping it restores stderr.
pub struct LogTee {
    /// A duplicate of the original stderr, put back on fd 2 at the end.
    saved: i32,
    thread: Option<JoinHandle<()>>,
}

impl LogTee {
    /// Starts the tee: `timestamps` on stderr's lines, and `file` (appended) when given.
    /// `None`: neither asked for, stderr is left alone.
    pub fn start(timestamps: bool, file: Option<&Path>) -> Result<Option<LogTee>, LogError> {
        if !timestamps && file.is_none() {
            return Ok(None);
        }
        let mut log = match file {
            Some(p) => Some(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|source| LogError::Open { path: p.to_path_buf(), source })?,
            ),
            None => None,
        };
        let os = || LogError::Redirect(std::io::Error::last_os_error());
        let mut fds = [0i32; 2];
        // SAFETY: `pipe` writes two new descriptors into the two-element array.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return Err(os());
        }
        let [read_end, write_end] = fds;
        // SAFETY: plain descriptor calls on descriptors this process owns (2, and the pipe's).
        let (saved, out_fd) = unsafe {
            let saved = libc::dup(2);
            let out_fd = if saved >= 0 { libc::dup(saved) } else { -1 };
            if out_fd < 0 || libc::dup2(write_end, 2) < 0 {
                return Err(os());
            }
            libc::close(write_end);
            (saved, out_fd)
        };
        // SAFETY: `read_end` and `out_fd` are fresh descriptors owned by nothing else; each
        // File closes its own.
        let (reader, mut out) = unsafe { (File::from_raw_fd(read_end), File::from_raw_fd(out_fd)) };
        let thread = std::thread::Builder::new()
            .name("log".into())
            .spawn(move || {
                let mut r = BufReader::new(reader);
                let mut line = Vec::new();
                while r.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                    let stamp = timestamp();
                    // A closed stderr or a full disk must not stop the run: the write is dropped.
                    let _ = out.write_all(&stamped(timestamps.then_some(stamp.as_str()), &line));
                    if let Some(f) = log.as_mut() {
                        let _ = f.write_all(&stamped(Some(&stamp), &line));
                    }
                    line.clear();
                }
                if let Some(f) = log.as_mut() {
                    let _ = f.sync_data();
                }
            })
            .map_err(LogError::Redirect)?;
        Ok(Some(LogTee { saved, thread: Some(thread) }))
    }
}

impl Drop for LogTee {
    fn drop(&mut self) {
        // SAFETY: `saved` is our duplicate of the original stderr; putting it back on fd 2
        // closes the pipe's last write end, so the thread sees the end of its input.
        unsafe {
            libc::dup2(self.saved, 2);
            libc::close(self.saved);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_get_a_utc_stamp_and_end_in_a_newline() {
        let t = timestamp();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
        assert_eq!(stamped(Some("2026-12-03T15:20:07Z"), b"done\n"), b"2026-12-03T15:20:07Z done\n");
        assert_eq!(stamped(None, b"tail"), b"tail\n");
    }
}
