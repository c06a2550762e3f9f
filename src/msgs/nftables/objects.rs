//! The objects of a table besides rules: base chains' hooks, sets and maps,
//! and their elements, each written as `nft` writes it.

use std::fmt;

use super::rule::Field;
use super::values::{concat, quote, Joined, KeyPart, KeyType, Verdict};

/// A base chain's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChainType {
    Filter,
    Nat,
}

impl fmt::Display for ChainType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
        })
    }
}

/// The hook of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChainHook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

impl fmt::Display for ChainHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChainHook::Prerouting => "prerouting",
            ChainHook::Input => "input",
            ChainHook::Forward => "forward",
            ChainHook::Output => "output",
            ChainHook::Postrouting => "postrouting",
        })
    }
}

/// A base chain's type, hook and priority (numeric, as knftables writes it:
/// `dstnat - 10` is -110).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BaseChain {
    pub kind: ChainType,
    pub hook: ChainHook,
    pub priority: i32,
}

impl fmt::Display for BaseChain {
    /// `type nat hook prerouting priority -100`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "type {} hook {} priority {}", self.kind, self.hook, self.priority)
    }
}

/// A set's flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetFlag {
    /// Elements added from the packet path (`update @set`).
    Dynamic,
    /// Elements expire.
    Timeout,
}

impl fmt::Display for SetFlag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SetFlag::Dynamic => "dynamic",
            SetFlag::Timeout => "timeout",
        })
    }
}

/// What a map's elements map to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetData {
    Verdict,
    /// Values of the types these packet fields have (`typeof ip daddr . th
    /// dport`): a DNAT target's address and port.
    Fields(Vec<Field>),
}

impl SetData {
    /// The data's types, a concatenation when more than one (none for a verdict).
    pub fn types(&self) -> Vec<KeyType> {
        match self {
            SetData::Verdict => vec![],
            SetData::Fields(fields) => fields.iter().map(|f| f.key_type()).collect(),
        }
    }
}

/// A named set (no `data`) or map.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SetSpec {
    pub name: String,
    /// The key's fields, a concatenation when more than one.
    pub key: Vec<KeyType>,
    /// The key given as the packet fields it is built from (`typeof`): how
    /// nft writes a key with a `numgen` slot, which has no type of its own.
    pub key_of: Option<Vec<Field>>,
    pub data: Option<SetData>,
    pub flags: Vec<SetFlag>,
    /// Element timeout in seconds.
    pub timeout: Option<u32>,
    /// Most elements the set holds (elements added from the packet path
    /// past it are refused).
    pub size: Option<u32>,
    pub comment: Option<String>,
}

impl SetSpec {
    /// A set without flags or timeout.
    pub fn set(name: &str, key: Vec<KeyType>, comment: Option<&str>) -> SetSpec {
        SetSpec {
            name: name.to_string(),
            key,
            key_of: None,
            data: None,
            flags: vec![],
            timeout: None,
            size: None,
            comment: comment.map(str::to_string),
        }
    }

    /// A verdict map.
    pub fn verdict_map(name: &str, key: Vec<KeyType>, comment: Option<&str>) -> SetSpec {
        SetSpec { data: Some(SetData::Verdict), ..SetSpec::set(name, key, comment) }
    }

    /// A set keyed by the values of packet fields (`typeof`).
    pub fn of_fields(name: &str, key: Vec<Field>) -> SetSpec {
        let types = key.iter().map(|f| f.key_type()).collect();
        SetSpec { key_of: Some(key), ..SetSpec::set(name, types, None) }
    }

    /// A data map from the values of packet fields `key` to values of the
    /// types of `data` (`typeof K : D`).
    pub fn data_map(name: &str, key: Vec<Field>, data: Vec<Field>) -> SetSpec {
        SetSpec { data: Some(SetData::Fields(data)), ..SetSpec::of_fields(name, key) }
    }

    pub fn is_map(&self) -> bool {
        self.data.is_some()
    }

    /// `set` or `map`, as nft names the object.
    pub fn kind(&self) -> &'static str {
        if self.is_map() {
            "map"
        } else {
            "set"
        }
    }
}

impl fmt::Display for SetSpec {
    /// The definition: `{ type K . K : verdict ; flags a,b ; timeout Ns ; comment "c" ; }`,
    /// or `{ typeof F . F : F . F ; size N ; ... }`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key_of {
            Some(fields) => write!(f, "{{ typeof {}", concat(fields))?,
            None => write!(f, "{{ type {}", concat(&self.key))?,
        }
        match &self.data {
            Some(SetData::Verdict) => f.write_str(" : verdict")?,
            Some(SetData::Fields(fields)) => write!(f, " : {}", concat(fields))?,
            None => {}
        }
        f.write_str(" ;")?;
        if let Some(n) = self.size {
            write!(f, " size {n} ;")?;
        }
        if !self.flags.is_empty() {
            write!(f, " flags {} ;", Joined(&self.flags, ","))?;
        }
        if let Some(t) = self.timeout {
            write!(f, " timeout {t}s ;")?;
        }
        if let Some(c) = &self.comment {
            write!(f, " comment {} ;", quote(c))?;
        }
        f.write_str(" }")
    }
}

/// What a map element maps its key to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElemValue {
    Verdict(Verdict),
    /// Data: an address and a port, say.
    Data(Vec<KeyPart>),
}

impl ElemValue {
    /// The chain a verdict continues in.
    pub fn chain(&self) -> Option<&str> {
        match self {
            ElemValue::Verdict(v) => v.chain(),
            ElemValue::Data(_) => None,
        }
    }
}

impl fmt::Display for ElemValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ElemValue::Verdict(v) => write!(f, "{v}"),
            ElemValue::Data(parts) => write!(f, "{}", concat(parts)),
        }
    }
}

/// An element of a set or map: its key, its value in a map, a comment.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    pub key: Vec<KeyPart>,
    pub value: Option<ElemValue>,
    pub comment: Option<String>,
}

impl Element {
    /// A set member.
    pub fn key(key: Vec<KeyPart>) -> Element {
        Element { key, value: None, comment: None }
    }

    /// A verdict map entry.
    pub fn to(key: Vec<KeyPart>, verdict: Verdict) -> Element {
        Element { key, value: Some(ElemValue::Verdict(verdict)), comment: None }
    }

    /// A data map entry.
    pub fn data(key: Vec<KeyPart>, data: Vec<KeyPart>) -> Element {
        Element { key, value: Some(ElemValue::Data(data)), comment: None }
    }
}

impl fmt::Display for Element {
    /// `key [comment "c"] [: value]`, as knftables writes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", concat(&self.key))?;
        if let Some(c) = &self.comment {
            write!(f, " comment {}", quote(c))?;
        }
        if let Some(v) = &self.value {
            write!(f, " : {v}")?;
        }
        Ok(())
    }
}
