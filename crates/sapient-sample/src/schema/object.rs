//! Arrays and objects.

use super::*;

pub(super) fn array(b: &mut Builder, cx: &mut Ctx, obj: &serde_json::Map<String, Value>, path: &str) -> Result<NodeId, GrammarError> {
    // Positional items: `prefixItems`, or the older tuple form of `items`.
    let (prefix, rest_key): (&[Value], &str) = match (obj.get("prefixItems"), obj.get("items")) {
        (Some(Value::Array(p)), _) => (p.as_slice(), "items"),
        (Some(_), _) => return Err(invalid(path, "prefixItems must be an array")),
        (None, Some(Value::Array(p))) => (p.as_slice(), "additionalItems"),
        (None, _) => (&[], "items"),
    };
    let mut prefix_nodes = Vec::new();
    for (i, sub) in prefix.iter().enumerate() {
        prefix_nodes.push(node(b, cx, sub, &format!("{path}/prefixItems/{i}"))?);
    }
    let rest = match obj.get(rest_key) {
        None | Some(Value::Bool(true)) => Some(b.json_value()?),
        Some(Value::Bool(false)) => None,
        Some(s) => Some(node(b, cx, s, &format!("{path}/{rest_key}"))?),
    };
    let min = get_u32(obj, "minItems", path)?.unwrap_or(0);
    let mut max = get_u32(obj, "maxItems", path)?.unwrap_or(u32::MAX);
    if rest.is_none() {
        max = max.min(prefix_nodes.len() as u32);
    }
    if min > max {
        return Err(GrammarError::Unsatisfiable(format!("no array length in [{min}, {max}] at {path}")));
    }
    let ws = b.ws()?;
    let sep = b.comma()?;
    if prefix_nodes.is_empty() {
        let item = rest.ok_or_else(|| GrammarError::Unsatisfiable(format!("items: false with minItems at {path}")))?;
        if max == 0 {
            let (o, c) = (b.lit("["), b.lit("]"));
            return Ok(b.seq_ws(&[Some(o), ws, Some(c)]));
        }
        return b.array_of(item, sep, ws, min, max);
    }
    // after(i): the items from position i on (i > 0: each preceded by a comma), then `]`.
    let close = b.lit("]");
    let end = b.seq_ws(&[ws, Some(close)]);
    let p = prefix_nodes.len() as u32;
    let tail = match rest {
        Some(item) if max > p => {
            let lo = min.saturating_sub(p);
            let hi = if max == u32::MAX { u32::MAX } else { max - p };
            let one = b.seq(vec![sep, item]);
            let more = b.add(crate::builder::Node::Repeat { item: one, sep: None, min: lo, max: hi });
            b.seq(vec![more, end])
        }
        _ => end,
    };
    let mut after = tail;
    for i in (0..p).rev() {
        let item = prefix_nodes[i as usize];
        let take = if i == 0 { b.seq_ws(&[ws, Some(item), Some(after)]) } else { b.seq(vec![sep, item, after]) };
        after = if i >= min {
            let stop = if i == 0 { b.seq_ws(&[ws, Some(close)]) } else { end };
            b.choice(vec![take, stop])
        } else {
            take
        };
    }
    let open = b.lit("[");
    Ok(b.seq(vec![open, after]))
}

/// The value schema of a key: its own, and every patternProperties schema whose pattern
/// matches it; additionalProperties when none applies.
fn schema_for<'a>(name: &str, own: Option<&'a Value>, patterns: &[(crate::dfa::DfaTable, &'a Value, String)], additional: &'a Value) -> std::borrow::Cow<'a, Value> {
    let mut all: Vec<&Value> = own.into_iter().collect();
    all.extend(patterns.iter().filter(|(d, _, _)| d.matches(name.as_bytes())).map(|(_, s, _)| *s));
    match all.len() {
        0 => std::borrow::Cow::Borrowed(additional),
        1 => std::borrow::Cow::Borrowed(all[0]),
        _ => std::borrow::Cow::Owned(serde_json::json!({ "allOf": all.into_iter().cloned().collect::<Vec<Value>>() })),
    }
}

/// Most states of a key automaton (the keys a pattern or the additional properties allow).
const MAX_KEY_STATES: usize = 20_000;

/// A member's value schema, or `None` when compiling it shows no value can satisfy it.
fn value_node(b: &mut Builder, cx: &mut Ctx, s: &Value, path: &str) -> Result<Option<NodeId>, GrammarError> {
    match node(b, cx, s, path) {
        Ok(v) => Ok(Some(v)),
        Err(GrammarError::Unsatisfiable(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

pub(super) fn object(b: &mut Builder, cx: &mut Ctx, obj: &serde_json::Map<String, Value>, path: &str) -> Result<NodeId, GrammarError> {
    let ws = b.ws()?;
    let sep = b.comma()?;
    let required: Vec<&str> = match obj.get("required") {
        None => vec![],
        Some(Value::Array(a)) => a.iter().map(|v| v.as_str().ok_or_else(|| invalid(path, "required must list strings"))).collect::<Result<_, _>>()?,
        Some(_) => return Err(invalid(path, "required must be an array")),
    };
    // Subschemas are borrowed, not copied: an object's properties hold all the schema
    // below it, and each level copying them made compiling deep schemas quadratic.
    let no_props = serde_json::Map::new();
    let props = match obj.get("properties") {
        None => &no_props,
        Some(Value::Object(m)) => m,
        Some(_) => return Err(invalid(path, "properties must be an object")),
    };
    let min = get_u32(obj, "minProperties", path)?.unwrap_or(0);
    let max = get_u32(obj, "maxProperties", path)?.unwrap_or(u32::MAX);
    // patternProperties: (the pattern's automaton over keys, its value schema).
    let mut patterns: Vec<(crate::dfa::DfaTable, &Value, String)> = Vec::new();
    match obj.get("patternProperties") {
        None => {}
        Some(Value::Object(m)) => {
            for (p, sub) in m {
                let d = b.dfa_of(&super::string::pattern_regex(p, path)?, true)?;
                patterns.push((d, sub, format!("{path}/patternProperties/{p}")));
            }
        }
        Some(_) => return Err(invalid(path, "patternProperties must be an object")),
    }
    // propertyNames: the keys' own constraint, as an automaton over their text.
    let names_dfa = match obj.get("propertyNames") {
        None | Some(Value::Bool(true)) => None,
        Some(s) => Some(super::string::key_content(b, s, &format!("{path}/propertyNames"))?),
    };
    let key_ok = |name: &str| names_dfa.as_ref().is_none_or(|d| d.as_ref().is_some_and(|d| d.matches(name.as_bytes())));
    // Absent additionalProperties allows any further property (JSON Schema's default;
    // strict mode wrote `false` into the schema first, see `strict_schema`).
    static ANY: Value = Value::Bool(true);
    let additional = obj.get("additionalProperties").unwrap_or(&ANY);
    // (member node, required) in schema order, then required names without a schema.
    let mut members: Vec<(NodeId, bool)> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut wanted: Vec<(String, Option<&Value>)> = props.iter().map(|(n, s)| (n.clone(), Some(s))).collect();
    wanted.extend(required.iter().filter(|r| !props.contains_key(**r)).map(|r| (r.to_string(), None)));
    for (name, own) in wanted {
        let req = required.contains(&name.as_str());
        names.push(name.clone());
        let v = if key_ok(&name) { value_node(b, cx, &schema_for(&name, own, &patterns, additional), &format!("{path}/properties/{name}"))? } else { None };
        match v {
            Some(v) => {
                let key = b.json_const(&Value::String(name.clone()))?;
                members.push((b.member(key, v)?, req));
            }
            // A property no value can satisfy must be absent.
            None if req => return Err(GrammarError::Unsatisfiable(format!("{name:?} is required but not allowed at {path}"))),
            None => {}
        }
    }
    // Members beyond the listed ones, after them: keys that are none of theirs (written
    // without escapes where some must be told apart), any number of them when the schema
    // asks for no property count. A key matching several patterns is not generated.
    let mut extras: Vec<NodeId> = Vec::new();
    let any_key = names.is_empty() && patterns.is_empty() && names_dfa.is_none();
    if patterns.is_empty() && *additional == Value::Bool(false) {
        // Only the listed properties: no automaton of other keys to build.
    } else if any_key {
        if let Some(v) = value_node(b, cx, additional, &format!("{path}/additionalProperties"))? {
            let key = b.json_string()?;
            extras.push(b.member(key, v)?);
        }
    } else {
        let what = format!("the keys at {path}");
        let keep = |r: Result<crate::dfa::DfaTable, GrammarError>| match r {
            Ok(d) => Ok(Some(d)),
            Err(GrammarError::Unsatisfiable(_)) => Ok(None),
            Err(e) => Err(e),
        };
        let any = b.dfa_of("(?s:.)*", true)?;
        let mut universe = match &names_dfa {
            Some(Some(d)) => keep(any.product(d, true, MAX_KEY_STATES, &what))?,
            Some(None) => None,
            None => Some(any),
        };
        if let (Some(u), false) = (&universe, names.is_empty()) {
            universe = match (&names_dfa, b.other_keys.get(&names)) {
                (None, Some(k)) => Some(k.clone()),
                _ => {
                    let forbid = |c: u8| c == b'"' || c == b'\\' || c < 0x20;
                    // (Names that must be escaped are never written as other keys anyway.)
                    let k = match crate::dfa::DfaTable::words(names.iter().map(|n| n.as_bytes()), &forbid, &what) {
                        Ok(listed) => keep(u.product(&listed, false, MAX_KEY_STATES, &what))?,
                        Err(GrammarError::Unsatisfiable(_)) => Some(u.clone()),
                        Err(e) => return Err(e),
                    };
                    if let (None, Some(k)) = (&names_dfa, &k) {
                        b.other_keys.insert(names.clone(), k.clone());
                    }
                    k
                }
            };
        }
        let Some(universe) = universe else { return finish(b, &members, None, sep, ws, min, max, path) };
        // Keys of each pattern (and of no pattern, for additionalProperties).
        let mut groups: Vec<(Option<usize>, &Value, String)> = (0..patterns.len()).map(|i| (Some(i), patterns[i].1, patterns[i].2.clone())).collect();
        groups.push((None, additional, format!("{path}/additionalProperties")));
        for (i, schema, spath) in groups {
            let mut keys = match i {
                Some(i) => universe.product(&patterns[i].0, true, MAX_KEY_STATES, &what),
                None => Ok(universe.clone()),
            };
            for (j, (d, _, _)) in patterns.iter().enumerate() {
                if Some(j) != i {
                    keys = keys.and_then(|k| k.product(d, false, MAX_KEY_STATES, &what));
                }
            }
            let keys = match keys {
                Ok(k) => k,
                Err(GrammarError::Unsatisfiable(_)) => continue,
                Err(e) => return Err(e),
            };
            if schema == &Value::Bool(false) {
                continue;
            }
            let Some(v) = value_node(b, cx, schema, &spath)? else { continue };
            let inner = b.add_dfa(keys);
            let (q1, q2) = (b.lit("\""), b.lit("\""));
            let key = b.seq(vec![q1, inner, q2]);
            extras.push(b.member(key, v)?);
        }
    }
    let extra = match extras.len() {
        0 => None,
        1 => Some(extras[0]),
        _ => Some(b.choice(extras)),
    };
    finish(b, &members, extra, sep, ws, min, max, path)
}

/// `{`, the members (and any extra ones) under the property count, `}`.
#[allow(clippy::too_many_arguments)]
fn finish(b: &mut Builder, members: &[(NodeId, bool)], extra: Option<NodeId>, sep: NodeId, ws: Option<NodeId>, min: u32, max: u32, path: &str) -> Result<NodeId, GrammarError> {
    let counted = min > 0 || max != u32::MAX;
    let mut memo: HashMap<(usize, u32, bool), Option<NodeId>> = HashMap::new();
    let body = object_tail(b, members, extra, sep, min, max, counted, 0, 0, true, &mut memo)
        .ok_or_else(|| GrammarError::Unsatisfiable(format!("no object with between {min} and {max} properties at {path}")))?;
    let (open, close) = (b.lit("{"), b.lit("}"));
    Ok(b.seq_ws(&[Some(open), ws, Some(body), ws, Some(close)]))
}

/// The members from `j` on, `c` already present (`first`: none yet, so no comma before the
/// next). `None` when no choice satisfies the required ones and the property count.
#[allow(clippy::too_many_arguments)]
fn object_tail(
    b: &mut Builder,
    members: &[(NodeId, bool)],
    extra: Option<NodeId>,
    sep: NodeId,
    min: u32,
    max: u32,
    counted: bool,
    j: usize,
    c: u32,
    first: bool,
    memo: &mut HashMap<(usize, u32, bool), Option<NodeId>>,
) -> Option<NodeId> {
    let c = if counted { c } else { 0 };
    if let Some(&r) = memo.get(&(j, c, first)) {
        return r;
    }
    let r = if j == members.len() {
        let mut alts = Vec::new();
        if c >= min {
            alts.push(b.seq(vec![]));
        }
        if let Some(e) = extra {
            if c < max {
                let lo = min.saturating_sub(c).max(1);
                let hi = if max == u32::MAX { u32::MAX } else { max - c };
                let rep = b.add(crate::builder::Node::Repeat { item: e, sep: Some(sep), min: lo, max: hi });
                alts.push(if first { rep } else { b.seq(vec![sep, rep]) });
            }
        }
        match alts.len() {
            0 => None,
            1 => Some(alts[0]),
            _ => Some(b.choice(alts)),
        }
    } else {
        let (m, req) = members[j];
        let take = if c < max {
            object_tail(b, members, extra, sep, min, max, counted, j + 1, c + 1, false, memo)
                .map(|t| if first { b.seq(vec![m, t]) } else { b.seq(vec![sep, m, t]) })
        } else {
            None
        };
        let skip = if req { None } else { object_tail(b, members, extra, sep, min, max, counted, j + 1, c, first, memo) };
        match (take, skip) {
            (Some(x), Some(y)) => Some(b.choice(vec![x, y])),
            (x, y) => x.or(y),
        }
    };
    memo.insert((j, c, first), r);
    r
}

/// Escape regex metacharacters (also inside a character class).
pub(super) fn regex_syntax_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

