//! Desired kernel objects with the service ports that want them.
//!
//! Several service ports can want the same object (two ports of one Service
//! share its cluster IP on kube-ipvs0; two Services can share an LB VIP), so
//! each object records its claimants. The effective value is the one of the
//! lowest claimant, so the outcome never depends on event order. Changing
//! one claimant touches only its own keys: this is what keeps a sync
//! proportional to the change.
//!
//! Memory matters here (a large cluster has tens of thousands of keys): a
//! key's lone claimant is stored inline, without an allocation of its own.

use std::collections::HashMap;
use std::hash::Hash;

/// An interned service port.
pub type Owner = u32;

/// How one key's effective value moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Moved<V> {
    Added(V),
    Changed(V),
    Removed,
}

/// The claimants of one key, lowest owner first.
#[derive(Debug)]
enum Claimants<V> {
    /// Nearly every key has a single claimant.
    One(Owner, V),
    /// Two or more, sorted by owner.
    Many(Vec<(Owner, V)>),
}

impl<V> Claimants<V> {
    fn effective(&self) -> &V {
        match self {
            Claimants::One(_, v) => v,
            Claimants::Many(c) => &c[0].1,
        }
    }

    fn claim(&mut self, owner: Owner, v: V) {
        match self {
            Claimants::One(o, old) if *o == owner => *old = v,
            Claimants::Many(c) => match c.binary_search_by_key(&owner, |(o, _)| *o) {
                Ok(i) => c[i].1 = v,
                Err(i) => c.insert(i, (owner, v)),
            },
            Claimants::One(..) => {
                let Claimants::One(o, old) = std::mem::replace(self, Claimants::Many(Vec::new())) else {
                    unreachable!("matched One above")
                };
                let pair = if o < owner { [(o, old), (owner, v)] } else { [(owner, v), (o, old)] };
                *self = Claimants::Many(pair.into());
            }
        }
    }

    /// Drops `owner`'s claim; false when no claimant is left.
    fn release(&mut self, owner: Owner) -> bool {
        match self {
            Claimants::One(o, _) => *o != owner,
            Claimants::Many(c) => {
                if let Ok(i) = c.binary_search_by_key(&owner, |(o, _)| *o) {
                    c.remove(i);
                }
                if c.len() == 1 {
                    let Some((o, v)) = c.pop() else { unreachable!("one claimant left") };
                    *self = Claimants::One(o, v);
                }
                true
            }
        }
    }
}

#[derive(Debug)]
pub struct Claims<K, V> {
    map: HashMap<K, Claimants<V>>,
}

impl<K, V> Default for Claims<K, V> {
    fn default() -> Self {
        Claims { map: HashMap::new() }
    }
}

impl<K: Hash + Eq + Clone, V: Clone + PartialEq> Claims<K, V> {
    pub fn effective(&self, k: &K) -> Option<&V> {
        self.map.get(k).map(Claimants::effective)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every key with its effective value.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.map.iter().map(|(k, c)| (k, c.effective()))
    }

    /// Who claims `k`, lowest owner first.
    pub fn owners(&self, k: &K) -> impl Iterator<Item = Owner> + '_ {
        let (one, many) = match self.map.get(k) {
            Some(Claimants::One(o, _)) => (Some(*o), &[][..]),
            Some(Claimants::Many(c)) => (None, &c[..]),
            None => (None, &[][..]),
        };
        one.into_iter().chain(many.iter().map(|(o, _)| *o))
    }

    fn claim(&mut self, k: K, owner: Owner, v: V) {
        match self.map.get_mut(&k) {
            Some(c) => c.claim(owner, v),
            None => {
                self.map.insert(k, Claimants::One(owner, v));
            }
        }
    }

    fn release(&mut self, k: &K, owner: Owner) {
        if let Some(c) = self.map.get_mut(k) {
            if !c.release(owner) {
                self.map.remove(k);
            }
        }
    }

    /// Replaces `owner`'s claims `old` by `new` and returns, for every key
    /// whose effective value moved, how it moved.
    pub fn replace(&mut self, owner: Owner, old: &[(K, V)], new: &[(K, V)]) -> Vec<(K, Moved<V>)> {
        let mut before: HashMap<K, Option<V>> = HashMap::with_capacity(old.len() + new.len());
        for (k, _) in old.iter().chain(new) {
            if !before.contains_key(k) {
                before.insert(k.clone(), self.effective(k).cloned());
            }
        }
        for (k, _) in old {
            self.release(k, owner);
        }
        for (k, v) in new {
            self.claim(k.clone(), owner, v.clone());
        }
        let mut moved = Vec::new();
        for (k, was) in before {
            let now = self.effective(&k);
            match (was, now) {
                (None, Some(v)) => moved.push((k, Moved::Added(v.clone()))),
                (Some(w), Some(v)) if w != *v => moved.push((k, Moved::Changed(v.clone()))),
                (Some(_), None) => moved.push((k, Moved::Removed)),
                _ => {}
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_key_stays_while_any_owner_claims_it() {
        let mut c: Claims<&str, ()> = Claims::default();
        assert_eq!(c.replace(1, &[], &[("ip", ())]), vec![("ip", Moved::Added(()))]);
        assert_eq!(c.replace(2, &[], &[("ip", ())]), vec![]);
        assert_eq!(c.replace(1, &[("ip", ())], &[]), vec![]);
        assert_eq!(c.replace(2, &[("ip", ())], &[]), vec![("ip", Moved::Removed)]);
        assert!(c.is_empty());
    }

    #[test]
    fn lowest_owner_wins_whatever_the_order() {
        let mut c: Claims<&str, u8> = Claims::default();
        c.replace(5, &[], &[("vs", 50)]);
        assert_eq!(c.replace(3, &[], &[("vs", 30)]), vec![("vs", Moved::Changed(30))]);
        assert_eq!(c.replace(3, &[("vs", 30)], &[]), vec![("vs", Moved::Changed(50))]);
        assert_eq!(c.effective(&"vs"), Some(&50));
    }

    #[test]
    fn unchanged_claims_move_nothing() {
        let mut c: Claims<&str, u8> = Claims::default();
        c.replace(1, &[], &[("a", 1), ("b", 2)]);
        assert_eq!(c.replace(1, &[("a", 1), ("b", 2)], &[("a", 1), ("b", 2)]), vec![]);
        let moved = c.replace(1, &[("a", 1), ("b", 2)], &[("a", 1), ("b", 3)]);
        assert_eq!(moved, vec![("b", Moved::Changed(3))]);
    }

    #[test]
    fn three_claimants_fall_back_in_owner_order() {
        let mut c: Claims<&str, u8> = Claims::default();
        for o in [7, 2, 5] {
            c.replace(o, &[], &[("k", o as u8)]);
        }
        assert_eq!(c.effective(&"k"), Some(&2));
        assert_eq!(c.owners(&"k").collect::<Vec<_>>(), vec![2, 5, 7]);
        assert_eq!(c.replace(2, &[("k", 2)], &[]), vec![("k", Moved::Changed(5))]);
        assert_eq!(c.replace(7, &[("k", 7)], &[]), vec![]);
        assert_eq!(c.owners(&"k").collect::<Vec<_>>(), vec![5]);
        assert_eq!(c.replace(5, &[("k", 5)], &[]), vec![("k", Moved::Removed)]);
        assert_eq!(c.owners(&"k").count(), 0);
        assert!(c.is_empty());
    }
}
