//! How many error rows a finished job may hold and still exit 0: `--allow-errors N` (a count)
//! and `--max-error-rate R` (a share of the rows, 0..1). With both, either suffices. The report
//! and the summary still count every error row; only the exit code changes. `--max-errors`
//! (stop early) is separate: an abort always exits 3.

use serde::{Deserialize, Serialize};

use super::usage::UsageError;

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorTolerance {
    /// `--allow-errors N`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_errors: Option<u64>,
    /// `--max-error-rate R`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_error_rate: Option<f64>,
}

impl ErrorTolerance {
    /// Checks the flags (a rate outside 0..1 is a usage error).
    pub fn new(allow_errors: Option<u64>, max_error_rate: Option<f64>) -> Result<Self, UsageError> {
        if let Some(r) = max_error_rate {
            if !(0.0..=1.0).contains(&r) {
                return Err(UsageError::new(format!(
                    "--max-error-rate {r} is not a share of the rows: give a number from 0 to 1 (0.01 = 1%)"
                )));
            }
        }
        Ok(ErrorTolerance { allow_errors, max_error_rate })
    }

    /// Whether `errors` error rows among `rows` rows pass (no error rows always pass).
    pub fn tolerates(&self, errors: u64, rows: u64) -> bool {
        if errors == 0 {
            return true;
        }
        let by_count = self.allow_errors.is_some_and(|n| errors <= n);
        let by_rate = self.max_error_rate.is_some_and(|r| rows > 0 && errors as f64 <= r * rows as f64);
        by_count || by_rate
    }

    /// The flags as written, for messages (`--allow-errors 5, --max-error-rate 0.01`).
    pub fn describe(&self) -> String {
        let mut v = Vec::new();
        if let Some(n) = self.allow_errors {
            v.push(format!("--allow-errors {n}"));
        }
        if let Some(r) = self.max_error_rate {
            v.push(format!("--max-error-rate {r}"));
        }
        if v.is_empty() {
            "no --allow-errors or --max-error-rate".into()
        } else {
            v.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_or_rate_suffices_and_bad_rates_are_refused() {
        let none = ErrorTolerance::default();
        assert!(none.tolerates(0, 10) && !none.tolerates(1, 10));
        let n = ErrorTolerance::new(Some(2), None).unwrap();
        assert!(n.tolerates(2, 10) && !n.tolerates(3, 10));
        let r = ErrorTolerance::new(None, Some(0.1)).unwrap();
        assert!(r.tolerates(1, 10) && !r.tolerates(2, 10) && r.tolerates(10, 100) && !r.tolerates(11, 100));
        let both = ErrorTolerance::new(Some(1), Some(0.1)).unwrap();
        assert!(both.tolerates(1, 2), "the count allows it");
        assert!(both.tolerates(10, 100), "the rate allows it");
        assert!(!both.tolerates(2, 4));
        assert!(ErrorTolerance::new(None, Some(1.5)).is_err() && ErrorTolerance::new(None, Some(-0.1)).is_err());
        assert_eq!(both.describe(), "--allow-errors 1, --max-error-rate 0.1");
    }
}
