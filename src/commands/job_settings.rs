//! Two settings of the job loop read from the environment: rows per checkpoint commit and the
//! interval of the plain progress lines.

/// Rows per checkpoint commit of `run` and `generate --input`. `DUSTOFF_COMMIT_ROWS` (hidden,
/// for tests and tiny jobs) lowers it so that a commit exists after a few records.
pub const COMMIT_ROWS: usize = 64;

pub fn commit_rows() -> usize {
    crate::sys::env::get("DUSTOFF_COMMIT_ROWS")
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(COMMIT_ROWS)
}

/// Seconds between the plain progress lines of a job (stderr not a terminal):
/// `DUSTOFF_PROGRESS_SECONDS`, else 10.
pub fn progress_interval() -> std::time::Duration {
    crate::sys::env::get("DUSTOFF_PROGRESS_SECONDS")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(std::time::Duration::from_secs(10), std::time::Duration::from_secs_f64)
}
