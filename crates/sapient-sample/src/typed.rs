//! Typed structured generation: [`Schema`] (a type's JSON Schema) and [`Parse`] (read a
//! value back from JSON text the schema accepts), derived with `#[derive(Schema, Parse)]`
//! (see the `sapient-derive` crate for the attributes). `T::grammar()` is the constraint
//! that makes a model write a `T`; `T::parse(text)` accepts exactly the JSON that `T`'s
//! schema describes (checked by [`crate::validate`], so in any property order and
//! formatting; everything the grammar generates is among it) and builds the value.
//!
//! Recursive types (`struct Tree { children: Vec<Tree> }`, `Option<Box<T>>`) are written with
//! `$ref`: a type met again while its own schema is being built becomes `{"$ref": "#"}` (the
//! outermost type) or `{"$ref": "#/$defs/<type>"}`, collected in the outermost `$defs`.

use crate::constraint::Constraint;
use crate::error::GrammarError;
use crate::grammar::Grammar;
use serde_json::Value;
use std::any::TypeId;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

#[doc(hidden)]
pub type __Value = Value;
#[doc(hidden)]
pub type __Map = serde_json::Map<String, Value>;

/// Errors reading a typed value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    #[error("the value does not satisfy the type's schema: {0}")]
    Invalid(#[from] crate::validate::Invalid),
    #[error(transparent)]
    Grammar(#[from] GrammarError),
    #[error("invalid JSON: {0}")]
    Json(String),
    #[error("at {path:?}: expected {expected}")]
    Type { path: String, expected: &'static str },
    #[error("missing field {0:?}")]
    Missing(String),
    #[error("at {path:?}: {value} does not fit the type")]
    OutOfRange { path: String, value: String },
}

/// A type with a JSON Schema.
pub trait Schema {
    fn json_schema() -> Value;
}

/// A type that can be read from JSON that its schema accepts.
pub trait Parse: Sized {
    /// Build the value from JSON (`path` names the place, for errors).
    fn from_json_at(v: &Value, path: &str) -> Result<Self, ParseError>;

    fn from_json(v: &Value) -> Result<Self, ParseError> {
        Self::from_json_at(v, "")
    }
    /// A struct field: absent is an error except for `Option`.
    fn from_json_field(v: Option<&Value>, path: &str) -> Result<Self, ParseError> {
        match v {
            Some(v) => Self::from_json_at(v, path),
            None => Err(ParseError::Missing(path.to_string())),
        }
    }
    /// The constraint for generating this type (compiled once per type).
    fn grammar() -> Result<Arc<Grammar>, GrammarError>
    where
        Self: Schema + 'static,
    {
        static CACHE: OnceLock<Mutex<HashMap<TypeId, Arc<Grammar>>>> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        if let Some(g) = cache.lock().ok().and_then(|c| c.get(&TypeId::of::<Self>()).cloned()) {
            return Ok(g);
        }
        let g = Arc::new(Grammar::json_schema(&Self::json_schema())?);
        if let Ok(mut c) = cache.lock() {
            c.insert(TypeId::of::<Self>(), g.clone());
        }
        Ok(g)
    }
    /// Parse JSON text that the type's schema accepts: `Json` if it is not JSON, `Invalid`
    /// (with where and why) if it does not satisfy the schema.
    fn parse(text: &str) -> Result<Self, ParseError>
    where
        Self: Schema + 'static,
    {
        let v: Value = serde_json::from_str(text).map_err(|e| ParseError::Json(e.to_string()))?;
        crate::validate::validate(&schema_of::<Self>(), &v)??;
        Self::from_json(&v)
    }
}

/// `T::json_schema()`, built once per type.
fn schema_of<T: Schema + 'static>() -> Arc<Value> {
    static CACHE: OnceLock<Mutex<HashMap<TypeId, Arc<Value>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(s) = cache.lock().ok().and_then(|c| c.get(&TypeId::of::<T>()).cloned()) {
        return s;
    }
    let s = Arc::new(T::json_schema());
    if let Ok(mut c) = cache.lock() {
        c.insert(TypeId::of::<T>(), s.clone());
    }
    s
}

// ---- helpers the derive expands to ----

thread_local! {
    /// Types whose schema is being built on this thread, outermost first (`None`: a
    /// container), and whether a nested occurrence referred to them.
    static EXPANDING: RefCell<Vec<(Option<String>, bool)>> = const { RefCell::new(Vec::new()) };
    /// Definitions of recursive types met below the outermost one.
    static DEFS: RefCell<__Map> = RefCell::new(__Map::new());
}

/// A `$defs` name for a Rust type name (`a::b::Tree<u8>` -> `a.b.Tree_u8_`).
fn def_name(type_name: &str) -> String {
    type_name.replace("::", ".").chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '_' { c } else { '_' }).collect()
}

/// The schema of a derived type, `$ref`s for recursion (see the module docs).
#[doc(hidden)]
pub fn __named(type_name: &str, build: impl FnOnce() -> Value) -> Value {
    expand(Some(def_name(type_name)), build)
}

/// A schema built around others (`Vec<T>`, `Option<T>`): when it is the outermost one, the
/// `$defs` of recursive types inside go on it, at the document's root.
fn nest(build: impl FnOnce() -> Value) -> Value {
    expand(None, build)
}

fn expand(key: Option<String>, build: impl FnOnce() -> Value) -> Value {
    let reference = |key: &str, outermost: bool| {
        serde_json::json!({"$ref": if outermost { "#".to_string() } else { format!("#/$defs/{key}") }})
    };
    if let Some(key) = &key {
        let seen = EXPANDING.with(|e| {
            let mut e = e.borrow_mut();
            let i = e.iter().position(|x| x.0.as_ref() == Some(key));
            if let Some(i) = i {
                e[i].1 = true;
            }
            i
        });
        if let Some(i) = seen {
            return reference(key, i == 0);
        }
        if DEFS.with(|d| d.borrow().contains_key(key)) {
            return reference(key, false);
        }
    }
    /// Leaves the thread-local state clean if `build` panics.
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            let empty = EXPANDING.with(|e| {
                let mut e = e.borrow_mut();
                e.pop();
                e.is_empty()
            });
            if empty && std::thread::panicking() {
                DEFS.with(|d| d.borrow_mut().clear());
            }
        }
    }
    EXPANDING.with(|e| e.borrow_mut().push((key.clone(), false)));
    let guard = Pop;
    let mut schema = build();
    let referenced = EXPANDING.with(|e| e.borrow().last().is_some_and(|x| x.1));
    drop(guard);
    let outermost = EXPANDING.with(|e| e.borrow().is_empty());
    match key {
        // Referred to from inside but not the root: its definition goes to `$defs`.
        Some(key) if referenced && !outermost => {
            let r = reference(&key, false);
            DEFS.with(|d| d.borrow_mut().insert(key, schema));
            r
        }
        _ => {
            if outermost {
                let defs = DEFS.with(|d| std::mem::take(&mut *d.borrow_mut()));
                if !defs.is_empty() {
                    if let Value::Object(m) = &mut schema {
                        m.insert("$defs".into(), Value::Object(defs));
                    }
                }
            }
            schema
        }
    }
}

#[doc(hidden)]
pub fn __json<T: Into<Value>>(v: T) -> Value {
    v.into()
}

#[doc(hidden)]
pub fn __object(props: __Map, required: &[&str]) -> Value {
    serde_json::json!({"type": "object", "properties": Value::Object(props), "required": required, "additionalProperties": false})
}

#[doc(hidden)]
pub fn __json_enum(names: &[&str]) -> Value {
    serde_json::json!({"enum": names})
}

#[doc(hidden)]
pub fn __any_of(alts: Vec<Value>) -> Value {
    serde_json::json!({"anyOf": alts})
}

/// Add keywords and a description. For `anyOf [T, null]` (an `Option`) the keywords go on
/// the non-null branches.
#[doc(hidden)]
pub fn __decorate(mut schema: Value, keywords: &[(&str, Value)], description: Option<&str>) -> Value {
    if !keywords.is_empty() {
        let is_null = |v: &Value| v.get("type") == Some(&Value::String("null".into()));
        match schema.get_mut("anyOf").and_then(|a| a.as_array_mut()) {
            Some(alts) if alts.iter().any(is_null) => {
                for a in alts.iter_mut().filter(|a| !is_null(a)) {
                    if let Value::Object(m) = a {
                        for (k, v) in keywords {
                            m.insert(k.to_string(), v.clone());
                        }
                    }
                }
            }
            _ => {
                if let Value::Object(m) = &mut schema {
                    for (k, v) in keywords {
                        m.insert(k.to_string(), v.clone());
                    }
                }
            }
        }
    }
    if let (Some(d), Value::Object(m)) = (description, &mut schema) {
        m.insert("description".into(), Value::String(d.to_string()));
    }
    schema
}

// ---- the standard types ----

impl Schema for String {
    fn json_schema() -> Value {
        serde_json::json!({"type": "string"})
    }
}
impl Parse for String {
    fn from_json_at(v: &Value, path: &str) -> Result<Self, ParseError> {
        v.as_str().map(str::to_string).ok_or_else(|| ParseError::Type { path: path.into(), expected: "a string" })
    }
}

impl Schema for bool {
    fn json_schema() -> Value {
        serde_json::json!({"type": "boolean"})
    }
}
impl Parse for bool {
    fn from_json_at(v: &Value, path: &str) -> Result<Self, ParseError> {
        v.as_bool().ok_or_else(|| ParseError::Type { path: path.into(), expected: "a boolean" })
    }
}

macro_rules! ints {
    ($($t:ty),*) => {$(
        impl Schema for $t {
            fn json_schema() -> Value {
                serde_json::json!({"type": "integer", "minimum": <$t>::MIN, "maximum": <$t>::MAX})
            }
        }
        impl Parse for $t {
            fn from_json_at(v: &Value, path: &str) -> Result<Self, ParseError> {
                // JSON Schema's integers include numbers written with a zero fraction (`3.0`).
                let n = v.as_i64().map(i128::from).or_else(|| v.as_u64().map(i128::from))
                    .or_else(|| v.as_f64().filter(|x| x.fract() == 0.0 && x.abs() < 1e38).map(|x| x as i128))
                    .ok_or_else(|| ParseError::Type { path: path.into(), expected: "an integer" })?;
                <$t>::try_from(n).map_err(|_| ParseError::OutOfRange { path: path.into(), value: n.to_string() })
            }
        }
    )*};
}
ints!(i8, i16, i32, i64, u8, u16, u32);

impl Schema for u64 {
    fn json_schema() -> Value {
        // Our integers are i64.
        serde_json::json!({"type": "integer", "minimum": 0, "maximum": i64::MAX})
    }
}
impl Parse for u64 {
    fn from_json_at(v: &Value, path: &str) -> Result<Self, ParseError> {
        v.as_u64()
            .or_else(|| v.as_f64().filter(|x| x.fract() == 0.0 && (0.0..=i64::MAX as f64).contains(x)).map(|x| x as u64))
            .ok_or_else(|| ParseError::Type { path: path.into(), expected: "a non-negative integer" })
    }
}

macro_rules! floats {
    ($($t:ty),*) => {$(
        impl Schema for $t {
            fn json_schema() -> Value {
                serde_json::json!({"type": "number"})
            }
        }
        impl Parse for $t {
            fn from_json_at(v: &Value, path: &str) -> Result<Self, ParseError> {
                v.as_f64().map(|x| x as $t).ok_or_else(|| ParseError::Type { path: path.into(), expected: "a number" })
            }
        }
    )*};
}
floats!(f32, f64);

impl<T: Schema> Schema for Option<T> {
    fn json_schema() -> Value {
        nest(|| serde_json::json!({"anyOf": [T::json_schema(), {"type": "null"}]}))
    }
}
impl<T: Parse> Parse for Option<T> {
    fn from_json_at(v: &Value, path: &str) -> Result<Self, ParseError> {
        if v.is_null() {
            Ok(None)
        } else {
            T::from_json_at(v, path).map(Some)
        }
    }
    fn from_json_field(v: Option<&Value>, path: &str) -> Result<Self, ParseError> {
        match v {
            None => Ok(None),
            Some(v) => Self::from_json_at(v, path),
        }
    }
}

impl<T: Schema> Schema for Vec<T> {
    fn json_schema() -> Value {
        nest(|| serde_json::json!({"type": "array", "items": T::json_schema()}))
    }
}
impl<T: Parse> Parse for Vec<T> {
    fn from_json_at(v: &Value, path: &str) -> Result<Self, ParseError> {
        let a = v.as_array().ok_or_else(|| ParseError::Type { path: path.into(), expected: "an array" })?;
        a.iter().enumerate().map(|(i, x)| T::from_json_at(x, &format!("{path}/{i}"))).collect()
    }
}

impl<T: Schema> Schema for Box<T> {
    fn json_schema() -> Value {
        T::json_schema()
    }
}
impl<T: Parse> Parse for Box<T> {
    fn from_json_at(v: &Value, path: &str) -> Result<Self, ParseError> {
        T::from_json_at(v, path).map(Box::new)
    }
}

/// Check `text` against a type's grammar byte by byte (used by tests and callers that
/// want the failing position): the length of the longest accepted prefix.
pub fn accepted_prefix<T: Schema + Parse + 'static>(text: &str) -> Result<usize, GrammarError> {
    let g = T::grammar()?;
    let mut st = g.start();
    let mut next = Default::default();
    for (i, &b) in text.as_bytes().iter().enumerate() {
        if !g.advance(&st, b, &mut next)? {
            return Ok(i);
        }
        std::mem::swap(&mut st, &mut next);
    }
    Ok(text.len())
}
