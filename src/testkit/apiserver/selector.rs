//! Label and field selectors, as the API server parses and applies them
//! (`k8s.io/apimachinery/pkg/labels` and `pkg/fields`), for the subset the
//! proxy's watchers and the tests use.

use serde_json::Value;

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    /// `key`
    Exists(String),
    /// `!key`
    NotExists(String),
    /// `key=value`, `key==value`
    Equals(String, String),
    /// `key!=value` (also true when the label is absent)
    NotEquals(String, String),
    /// `key in (a,b)`
    In(String, Vec<String>),
    /// `key notin (a,b)` (also true when the label is absent)
    NotIn(String, Vec<String>),
}

/// A parsed `labelSelector`; empty selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    /// Parses `a=b,!c,d in (e,f)`; the message says what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let terms = split_terms(text)?;
        let requirements = terms.iter().map(|term| parse_requirement(term)).collect::<Result<_, _>>()?;
        Ok(Self(requirements))
    }

    /// Whether an object's `metadata` (its `labels`) satisfies every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.0.iter().all(|requirement| match requirement {
            Requirement::Exists(key) => label(key).is_some(),
            Requirement::NotExists(key) => label(key).is_none(),
            Requirement::Equals(key, value) => label(key) == Some(value.as_str()),
            Requirement::NotEquals(key, value) => label(key) != Some(value.as_str()),
            Requirement::In(key, values) => label(key).is_some_and(|l| values.iter().any(|v| v == l)),
            Requirement::NotIn(key, values) => label(key).is_none_or(|l| values.iter().all(|v| v != l)),
        })
    }
}

/// Splits on commas outside parentheses; empty text is no term.
fn split_terms(text: &str) -> Result<Vec<String>, String> {
    let (mut terms, mut current, mut depth) = (Vec::new(), String::new(), 0u32);
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.checked_sub(1).ok_or_else(|| format!("unbalanced ')' in {text:?}"))?,
            ',' if depth == 0 => {
                terms.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if depth != 0 {
        return Err(format!("unbalanced '(' in {text:?}"));
    }
    if !current.is_empty() || !terms.is_empty() {
        terms.push(current);
    }
    Ok(terms)
}

fn parse_requirement(term: &str) -> Result<Requirement, String> {
    let term = term.trim();
    let requirement = if let Some(key) = term.strip_prefix('!') {
        Requirement::NotExists(key.trim().to_owned())
    } else if let Some((key, values)) = split_set(term, " notin ")? {
        Requirement::NotIn(key, values)
    } else if let Some((key, values)) = split_set(term, " in ")? {
        Requirement::In(key, values)
    } else if let Some((key, value)) = term.split_once("!=") {
        Requirement::NotEquals(key.trim().to_owned(), value.trim().to_owned())
    } else if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
        Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
    } else {
        Requirement::Exists(term.to_owned())
    };
    check_key(&requirement, term)?;
    Ok(requirement)
}

/// `key <op> (a, b)` into key and values; `None` if `op` is not there.
fn split_set(term: &str, op: &str) -> Result<Option<(String, Vec<String>)>, String> {
    let Some((key, set)) = term.split_once(op) else {
        return Ok(None);
    };
    let set = set.trim();
    let inner = (set.strip_prefix('(').and_then(|s| s.strip_suffix(')')))
        .ok_or_else(|| format!("unable to parse requirement: {term:?}: expected a parenthesised set"))?;
    let values = inner.split(',').map(|v| v.trim().to_owned()).collect();
    Ok(Some((key.trim().to_owned(), values)))
}

fn check_key(requirement: &Requirement, term: &str) -> Result<(), String> {
    let key = match requirement {
        Requirement::Exists(k)
        | Requirement::NotExists(k)
        | Requirement::Equals(k, _)
        | Requirement::NotEquals(k, _)
        | Requirement::In(k, _)
        | Requirement::NotIn(k, _) => k,
    };
    let valid = |c: char| c.is_ascii_alphanumeric() || "-_./".contains(c);
    if key.is_empty() || !key.chars().all(valid) {
        return Err(format!("unable to parse requirement: {term:?}: invalid label key {key:?}"));
    }
    Ok(())
}

/// One `field=value` or `field!=value` term.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldTerm {
    field: String,
    equal: bool,
    value: String,
}

/// A parsed `fieldSelector`; empty selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<FieldTerm>);

impl FieldSelector {
    /// Parses `metadata.name=a,spec.clusterIP!=None`; fields outside
    /// `supported` are refused as the API server refuses them.
    pub fn parse(text: &str, supported: &[&str]) -> Result<Self, String> {
        let terms = text.split(',').filter(|t| !t.is_empty());
        let parsed = terms.map(|term| parse_field_term(term, supported)).collect::<Result<_, _>>()?;
        Ok(Self(parsed))
    }

    /// Whether the object satisfies every term; a missing field is `""`.
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|term| {
            let pointer = format!("/{}", term.field.replace('.', "/"));
            let actual = match object.pointer(&pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (actual == term.value) == term.equal
        })
    }
}

fn parse_field_term(term: &str, supported: &[&str]) -> Result<FieldTerm, String> {
    let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
        (f, false, v)
    } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        (f, true, v)
    } else {
        return Err(format!("invalid selector: {term:?}; can't understand {term:?}"));
    };
    if !supported.contains(&field) {
        return Err(format!("field label not supported: {field}"));
    }
    Ok(FieldTerm { field: field.to_owned(), equal, value: value.to_owned() })
}
