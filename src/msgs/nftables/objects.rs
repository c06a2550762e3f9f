//! The objects of a table besides rules: base chains' hooks, sets and maps,
//! and their elements, each written as `nft` writes it.

use std::fmt;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetData {
    Verdict,
}

impl fmt::Display for SetData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SetData::Verdict => "verdict",
        })
    }
}

/// A named set (no `data`) or map.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SetSpec {
    pub name: String,
    /// The key's fields, a concatenation when more than one.
    pub key: Vec<KeyType>,
    pub data: Option<SetData>,
    pub flags: Vec<SetFlag>,
    /// Element timeout in seconds.
    pub timeout: Option<u32>,
    pub comment: Option<String>,
}

impl SetSpec {
    /// A set without flags or timeout.
    pub fn set(name: &str, key: Vec<KeyType>, comment: Option<&str>) -> SetSpec {
        SetSpec {
            name: name.to_string(),
            key,
            data: None,
            flags: vec![],
            timeout: None,
            comment: comment.map(str::to_string),
        }
    }

    /// A verdict map.
    pub fn verdict_map(name: &str, key: Vec<KeyType>, comment: Option<&str>) -> SetSpec {
        SetSpec { data: Some(SetData::Verdict), ..SetSpec::set(name, key, comment) }
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
    /// The definition: `{ type K . K : verdict ; flags a,b ; timeout Ns ; comment "c" ; }`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{ type {}", concat(&self.key))?;
        if let Some(d) = &self.data {
            write!(f, " : {d}")?;
        }
        f.write_str(" ;")?;
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

/// An element of a set or map: its key, its value in a map, a comment.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    pub key: Vec<KeyPart>,
    pub value: Option<Verdict>,
    pub comment: Option<String>,
}

impl Element {
    /// A set member.
    pub fn key(key: Vec<KeyPart>) -> Element {
        Element { key, value: None, comment: None }
    }

    /// A verdict map entry.
    pub fn to(key: Vec<KeyPart>, verdict: Verdict) -> Element {
        Element { key, value: Some(verdict), comment: None }
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
