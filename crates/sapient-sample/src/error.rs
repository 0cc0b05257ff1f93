//! Errors building or running a grammar.

/// Errors building or running a grammar.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GrammarError {
    #[error("invalid regex {pattern:?}: {message}")]
    InvalidRegex { pattern: String, message: String },
    #[error("regex {pattern:?} needs more than {states} DFA states (or more than 16 MiB to compile)")]
    RegexTooLarge { pattern: String, states: usize },
    #[error("unsatisfiable constraint: {0}")]
    Unsatisfiable(String),
    #[error("invalid JSON schema at {path}: {message}")]
    InvalidSchema { path: String, message: String },
    #[error("unsupported JSON schema keyword {keyword:?} at {path}")]
    UnsupportedSchema { path: String, keyword: String },
    #[error("unresolved $ref {0:?} (only references within the schema are followed)")]
    UnresolvedRef(String),
    #[error("a repetition without an upper bound repeats an item that can be empty")]
    NullableRepeat,
    #[error("the grammar recurses without consuming input (left recursion or an empty loop)")]
    Loop,
    #[error("{what} is over the limit of {limit}")]
    TooLarge { what: String, limit: usize },
    #[error("invalid grammar option: {0}")]
    InvalidOption(String),
    #[error("the grammar is too ambiguous: more than {0} parses alive at once")]
    TooAmbiguous(usize),
    #[error("GBNF grammar, line {line}, column {column}: {message}")]
    Gbnf { line: usize, column: usize, message: String },
}
