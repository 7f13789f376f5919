//! Progress bars for long copies. Shown only when stderr is a terminal, so
//! scripts and logs get nothing but the result and errors.

use std::io::IsTerminal;

use anyhow::Result;
use grove_store::Pool;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

const BAR_TEMPLATE: &str =
    "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}";
const COUNT_TEMPLATE: &str = "{msg} [{bar:30}] {pos}/{len} stripes eta {eta}";
const BAR_CHARS: &str = "=> ";

/// A byte-count progress bar that clears itself when dropped, so that an
/// error message printed afterwards stands alone on its line.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar for `total_bytes` labelled `what`, hidden unless stderr is a terminal.
    pub fn bytes(what: &str, total_bytes: u64) -> Progress {
        Progress::with_template(what, total_bytes, BAR_TEMPLATE)
    }

    /// A bar counting `total` stripes (a rebuild's, a scrub's).
    pub fn count(what: &str, total: u64) -> Progress {
        Progress::with_template(what, total, COUNT_TEMPLATE)
    }

    fn with_template(what: &str, total_bytes: u64, template: &str) -> Progress {
        let bar = if std::io::stderr().is_terminal() {
            let bar =
                ProgressBar::with_draw_target(Some(total_bytes), ProgressDrawTarget::stderr());
            // The template is a constant, so failing to parse it is a bug
            // in this file that the first run on a terminal shows.
            let style = ProgressStyle::with_template(template)
                .expect("the templates are valid")
                .progress_chars(BAR_CHARS);
            bar.set_style(style);
            bar.set_message(what.to_string());
            bar
        } else {
            ProgressBar::hidden()
        };
        Progress { bar }
    }

    pub fn advance(&self, bytes: u64) {
        self.bar.inc(bytes);
    }

    /// Sets the total when it becomes known after the bar was made.
    pub fn set_length(&self, total_bytes: u64) {
        self.bar.set_length(total_bytes);
    }

    pub fn set_position(&self, bytes: u64) {
        self.bar.set_position(bytes);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// Reclaims everything pending in bounded batches, with a progress bar on
/// a terminal. Returns the bytes freed.
pub fn reclaim_with_progress(pool: &Pool) -> Result<u64> {
    let pending = pool.pending_free_bytes()?;
    if pending == 0 {
        return Ok(0);
    }
    let bar = Progress::bytes("reclaiming", pending);
    Ok(pool.reclaim_all(|freed| bar.set_position(freed.min(pending)))?)
}
