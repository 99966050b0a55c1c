//! The interactive front end of the shell: a reedline editor with history,
//! the `spindle> ` / `     -> ` prompts, and multi-line input that is
//! submitted once it ends a statement with `;`.
//!
//! The editor's [`Validator`] keeps Enter inserting a line break while the
//! buffer holds an unfinished statement (judged by the same splitter the
//! shell runs statements with), so a whole multi-line statement is one
//! history entry and can be recalled and edited as a unit. Ctrl-C clears the
//! buffer; Ctrl-D on an empty buffer leaves.

use std::borrow::Cow;
use std::io::{self, Write};

use reedline::{
    FileBackedHistory, Prompt, PromptEditMode, PromptHistorySearch, PromptHistorySearchStatus,
    Reedline, Signal, ValidationResult, Validator,
};

use crate::shell::{self, eprintln_safe, Flow, Shell};
use crate::split::Splitter;

/// Number of entries kept in the history file.
const HISTORY_CAPACITY: usize = 10_000;

/// Runs the interactive loop until `\q`, `quit`, `exit` or Ctrl-D.
pub fn run(shell: &mut Shell, location: &str) {
    let mut editor = Reedline::create()
        .with_validator(Box::new(SqlValidator))
        .use_bracketed_paste(true);
    if let Some(path) = shell::history_file() {
        match FileBackedHistory::with_file(HISTORY_CAPACITY, path.clone()) {
            Ok(history) => editor = editor.with_history(Box::new(history)),
            Err(e) => tracing::warn!(
                path = %path.display(),
                error = %e,
                "cannot use the history file; history is kept in memory only"
            ),
        }
    }

    // A closed stdout shows up again (and ends the shell) on the first result.
    let _ = writeln!(
        io::stdout(),
        "spindle {} — {location}\nType \\? for help, \\q to quit.\n",
        env!("CARGO_PKG_VERSION")
    );
    let prompt = SqlPrompt;
    loop {
        match editor.read_line(&prompt) {
            Ok(Signal::Success(buffer)) => {
                let mut text = buffer;
                if !text.ends_with('\n') {
                    text.push('\n');
                }
                let mut flow = Flow::Continue;
                for line in text.split_inclusive('\n') {
                    flow = shell.feed_line(line);
                    if flow == Flow::Quit {
                        break;
                    }
                }
                if flow == Flow::Quit {
                    break;
                }
                // The validator only accepts complete input; anything left
                // would otherwise silently prefix the next statement.
                if !shell.at_statement_start() {
                    shell.discard_pending();
                }
            }
            Ok(Signal::CtrlC) => shell.discard_pending(),
            Ok(Signal::CtrlD) => break,
            Ok(_) => {}
            Err(e) => {
                eprintln_safe(&format!("spindle: terminal error: {e}"));
                break;
            }
        }
    }
    if let Err(e) = editor.sync_history() {
        tracing::warn!(error = %e, "cannot save the history");
    }
}

/// Whether the editor buffer is ready to run: it ends outside any string
/// or comment, and every statement in it is terminated by `;` (shell
/// commands need no `;`).
pub fn input_complete(buffer: &str) -> bool {
    let mut splitter = Splitter::new();
    for line in buffer.split_inclusive('\n') {
        if splitter.is_blank() && shell::is_shell_command(line.trim()) {
            splitter.clear();
            continue;
        }
        splitter.push(line);
    }
    splitter.is_blank()
}

struct SqlValidator;

impl Validator for SqlValidator {
    fn validate(&self, line: &str) -> ValidationResult {
        if input_complete(line) {
            ValidationResult::Complete
        } else {
            ValidationResult::Incomplete
        }
    }
}

struct SqlPrompt;

impl Prompt for SqlPrompt {
    fn render_prompt_left(&self) -> Cow<'_, str> {
        Cow::Borrowed("spindle")
    }

    fn render_prompt_right(&self) -> Cow<'_, str> {
        Cow::Borrowed("")
    }

    fn render_prompt_indicator(&self, _mode: PromptEditMode) -> Cow<'_, str> {
        Cow::Borrowed("> ")
    }

    fn render_prompt_multiline_indicator(&self) -> Cow<'_, str> {
        Cow::Borrowed("     -> ")
    }

    fn render_prompt_history_search_indicator(
        &self,
        history_search: PromptHistorySearch,
    ) -> Cow<'_, str> {
        let failing = match history_search.status {
            PromptHistorySearchStatus::Passing => "",
            PromptHistorySearchStatus::Failing => "failing ",
        };
        Cow::Owned(format!(
            "({failing}reverse-search: {}) ",
            history_search.term
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completeness_of_editor_input() {
        assert!(input_complete(""));
        assert!(input_complete("   "));
        assert!(input_complete("SELECT 1;"));
        assert!(input_complete("SELECT 1; -- trailing comment"));
        assert!(input_complete("\\dt"));
        assert!(input_complete("quit"));
        assert!(input_complete("SELECT 1;\n\\d singers"));
        assert!(!input_complete("SELECT 1"));
        assert!(!input_complete("SELECT 1;\nSELECT"));
        assert!(!input_complete("SELECT 'a;"));
        assert!(!input_complete("SELECT 1; /* open"));
        assert!(!input_complete("SELECT\n\\dt"));
        assert!(input_complete("SELECT\n'x;';"));
    }
}
