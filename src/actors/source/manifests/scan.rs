//! The synchronous core: [`ManifestDir::scan`] lists the directory, re-reads
//! the files that changed (once quiet), and turns what changed into events,
//! the first file by name winning where several hold one object.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::hash::{DefaultHasher, Hasher};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Node;
use tracing::{debug, warn};

use super::decode::{
    each_object, names_node, node_named, outline_file, parse_file, Format, Held, Object, ObjectKey, Objects, Outline,
};
use super::error::{Duplicate, ManifestError};
use crate::msgs::source::{ResourceKind, SourceEvent};

/// How long a file written in place must be quiet before it is read.
pub const SETTLE: Duration = Duration::from_secs(1);
/// A file modified this close to when it was read may change again without
/// a visible change of mtime or size (coarse timestamps), so it is re-read,
/// and re-parsed if its content changed.
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// How the first scan reads a large file: one larger than `file_bytes` is
/// read twice, first for its outline (every object decoded, so a bad file
/// is still refused whole, but only identities kept), then again handing
/// its objects over `objects` at a time. A file of 10,000 services' objects
/// (12 MB) held decoded cost ≈ 69 MB; reading it twice costs a second
/// decode.
#[derive(Debug, Clone, Copy)]
pub struct Chunks {
    pub file_bytes: usize,
    pub objects: usize,
}

impl Default for Chunks {
    fn default() -> Self {
        Chunks { file_bytes: 1 << 20, objects: 1000 }
    }
}

/// What one [`ManifestDir::scan`] found.
#[derive(Debug, Default)]
pub struct ScanResult {
    /// Changes since the previous scan, Services before EndpointSlices before
    /// Nodes before ServiceCIDRs; after the first successful scan, `Synced`
    /// for every kind.
    pub events: Vec<SourceEvent>,
    /// Files (or the directory) that could not be used, each already logged.
    pub errors: Vec<ManifestError>,
    /// Files still being written were left for later: scan again after this.
    pub settle_again: Option<Duration>,
    /// Copies of objects refused because another copy is used, each already logged.
    pub refused: Vec<Duplicate>,
}

/// The synchronous core of the manifest source: a directory and what was
/// last read from each of its files.
#[derive(Debug)]
pub struct ManifestDir {
    dir: PathBuf,
    files: BTreeMap<PathBuf, CachedFile>,
    /// What the events so far have told the consumer: the winning objects.
    current: Objects,
    synced: bool,
    settle: Duration,
    chunks: Chunks,
}

impl ManifestDir {
    /// A manifest directory not scanned yet.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            files: BTreeMap::new(),
            current: Objects::new(),
            synced: false,
            settle: SETTLE,
            chunks: Chunks::default(),
        }
    }

    /// Another settle time than [`SETTLE`] (zero: read files as they are).
    pub fn with_settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    /// Other [`Chunks`] than the default's for the first scan.
    pub fn with_chunks(mut self, chunks: Chunks) -> Self {
        self.chunks = chunks;
        self
    }

    /// The directory this reads.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Re-reads the files that changed, appeared or vanished since the last
    /// scan and returns the resulting events: `Applied` for new or changed
    /// objects, `Deleted` (with the object's identity) for vanished ones, and
    /// after the first successful scan `Synced` for every kind. If the
    /// directory cannot be listed, nothing changes and the error is returned.
    pub fn scan(&mut self) -> ScanResult {
        let mut pass = Pass::default();
        match list_dir(&self.dir) {
            Ok(listing) => self.refresh_all(listing, &mut pass),
            Err(err) => pass.report(err),
        }
        let mut events = self.settle_all(std::mem::take(&mut pass.touched), &pass.fresh, &mut pass.refused);
        if pass.listed && !self.synced {
            self.synced = true;
            events.extend(ResourceKind::ALL.map(SourceEvent::Synced));
        }
        ScanResult { events, errors: pass.errors, settle_again: pass.settle_again, refused: pass.refused }
    }

    /// The first scan, file by file in name order: `each` gets what every
    /// file brings as it is read (the first file holding an object wins, as
    /// in [`ManifestDir::scan`], whose results it leaves behind), and last
    /// `Synced` for every kind. Only one file's decoded objects are held at
    /// a time, and of a large file only [`Chunks::objects`] at a time: at
    /// 10,000 services the whole directory's were ≈ 69 MB, the daemon's
    /// peak. If the directory cannot be listed, nothing is read.
    pub fn scan_file_by_file(&mut self, mut each: impl FnMut(ScanResult)) -> Result<(), ManifestError> {
        let listing = list_dir(&self.dir)?;
        let now = SystemTime::now();
        for (path, stamp) in listing {
            let mut pass = Pass { listed: true, ..Pass::default() };
            let large = match stamp {
                Ok(stamp) => self.refresh(path, stamp, now, &mut pass, Some(self.chunks.file_bytes)),
                Err(source) => {
                    self.stat_failed(path, source, &mut pass);
                    None
                }
            };
            if let Some(large) = large {
                self.hand_over_in_chunks(&large, &mut pass, &mut each);
            }
            let events = self.settle_all(std::mem::take(&mut pass.touched), &pass.fresh, &mut pass.refused);
            drop(pass.fresh);
            each(ScanResult { events, errors: pass.errors, settle_again: pass.settle_again, refused: pass.refused });
        }
        if !self.synced {
            self.synced = true;
            let events = ResourceKind::ALL.map(SourceEvent::Synced);
            each(ScanResult { events: events.into(), ..ScanResult::default() });
        }
        Ok(())
    }

    /// This node's Node (named `name`) as the first scan would report it:
    /// from the first file by name that holds it and is valid as a whole.
    /// Only that file's objects are decoded; the others are read as far as
    /// telling whether they name the Node. A file that cannot be read is
    /// passed over here and reported by the scan.
    pub fn find_node(&self, name: &str) -> Result<Option<Arc<Node>>, ManifestError> {
        for (path, stamp) in list_dir(&self.dir)? {
            let Ok(bytes) = stamp.and_then(|_| fs::read(&path)) else { continue };
            if !names_node(&path, &bytes, name) {
                continue;
            }
            // Outlined: the file is still validated whole, but only its
            // Nodes are kept decoded (the rest as identities and digests).
            if let Ok(outline) = outline_file(&path, &bytes, &mut Vec::new()) {
                return Ok(node_named(&outline.objects, name));
            }
        }
        Ok(None)
    }

    /// Whether the directory can be listed (what a start checks).
    pub fn check_listable(&self) -> Result<(), ManifestError> {
        list_dir(&self.dir).map(drop)
    }

    fn refresh_all(&mut self, listing: Listing, pass: &mut Pass) {
        pass.listed = true;
        let gone: Vec<PathBuf> = (self.files.keys()).filter(|path| !listing.contains_key(*path)).cloned().collect();
        for path in gone {
            self.forget(&path, pass);
        }
        let now = SystemTime::now();
        for (path, stamp) in listing {
            match stamp {
                Ok(stamp) => drop(self.refresh(path, stamp, now, pass, None)),
                Err(source) => self.stat_failed(path, source, pass),
            }
        }
    }

    /// Reads the file at `path` again if it changed. One larger than
    /// `outline_above` bytes is only outlined: its objects are left to
    /// [`Self::hand_over_in_chunks`] (returned).
    fn refresh(
        &mut self,
        path: PathBuf,
        stamp: Stamp,
        now: SystemTime,
        pass: &mut Pass,
        outline_above: Option<usize>,
    ) -> Option<LargeFile> {
        if self.files.get(&path).is_some_and(|f| f.is_fresh(stamp)) {
            return None;
        }
        if self.synced {
            if let Some(wait) = stamp.settling(now, self.settle) {
                debug!(path = %path.display(), ?wait, "manifest still being written; reading it once quiet");
                pass.settle_again = Some(pass.settle_again.map_or(wait, |w| w.min(wait)));
                return None;
            }
        }
        if let Some(file) = self.files.get_mut(&path) {
            // Its stamp changed, or is too recent to tell: whether its
            // content changed is read hashed in pieces, so an unchanged
            // large file costs no buffer of its size.
            if file.hash.is_some() && hash_file(&path).ok() == file.hash {
                file.seen(stamp, now);
                return None;
            }
        }
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                self.forget(&path, pass);
                return None;
            }
            Err(source) => {
                let file = self.files.entry(path.clone()).or_default();
                // Reported once per version of the file.
                let new_version = file.stamp != Some(stamp);
                file.seen(stamp, now);
                if new_version {
                    pass.report(ManifestError::ReadFile { path, source });
                }
                return None;
            }
        };
        let file = self.files.entry(path.clone()).or_default();
        file.seen(stamp, now);
        let hash = content_hash(&bytes);
        if file.hash == Some(hash) {
            return None;
        }
        file.hash = Some(hash);
        if outline_above.is_some_and(|above| bytes.len() > above) {
            return match outline_file(&path, &bytes, &mut pass.refused) {
                Ok(mut outline) => {
                    let objects = std::mem::take(&mut outline.objects).into_iter().collect();
                    let old = std::mem::replace(&mut file.objects, objects);
                    pass.touch_differences(&old, &file.objects);
                    Some(LargeFile { path, bytes, outline })
                }
                Err(err) => {
                    pass.report(err);
                    None
                }
            };
        }
        match parse_file(&path, &bytes, &mut pass.refused) {
            Ok(objects) => {
                let kept: FileObjects = objects.iter().map(|(key, held)| (key.clone(), held.kept())).collect();
                let old = std::mem::replace(&mut file.objects, kept);
                pass.touch_differences(&old, &file.objects);
                let whole = objects.into_iter().filter_map(|(key, held)| Some(((path.clone(), key), held.object?)));
                pass.fresh.extend(whole);
            }
            // The file's last good objects stay.
            Err(err) => pass.report(err),
        }
        None
    }

    /// The objects of a file [`Self::refresh`] outlined, read again and
    /// handed to `each` as events, [`Chunks::objects`] at a time; the
    /// touched objects of other files are left in `pass`.
    fn hand_over_in_chunks(&mut self, large: &LargeFile, pass: &mut Pass, each: &mut impl FnMut(ScanResult)) {
        let mut chunk = Fresh::new();
        let size = self.chunks.objects.max(1);
        let mut flush = |this: &mut Self, chunk: &mut Fresh, pass: &mut Pass| {
            let fresh = std::mem::take(chunk);
            let touched = fresh.keys().map(|(_, key)| key.clone()).collect();
            let events = this.settle_all(touched, &fresh, &mut pass.refused);
            drop(fresh);
            let refused = std::mem::take(&mut pass.refused);
            each(ScanResult { events, refused, ..ScanResult::default() });
        };
        let read = each_object(&large.path, &large.bytes, &large.outline, &mut |key, object| {
            // The first copy in the file (the outline's); a later one was refused.
            if pass.touched.remove(&key) {
                chunk.insert((large.path.clone(), key), object);
                if chunk.len() >= size {
                    flush(self, &mut chunk, pass);
                }
            }
        });
        if !chunk.is_empty() {
            flush(self, &mut chunk, pass);
        }
        if let Err(error) = read {
            // The same bytes decoded once already: the objects not handed
            // over are read again one by one when settled.
            warn!(%error, "a manifest file read twice failed the second time");
        }
    }

    /// A listed file that cannot be stat'ed: reported once, objects kept.
    fn stat_failed(&mut self, path: PathBuf, source: io::Error, pass: &mut Pass) {
        let file = self.files.entry(path.clone()).or_default();
        let already_reported = file.stamp.is_none() && file.read_at.is_some();
        file.stamp = None;
        file.read_at = Some(SystemTime::now());
        if !already_reported {
            pass.report(ManifestError::ReadFile { path, source });
        }
    }

    fn forget(&mut self, path: &Path, pass: &mut Pass) {
        if let Some(file) = self.files.remove(path) {
            debug!(path = %path.display(), "manifest file removed");
            pass.touched.extend(file.objects.into_keys());
        }
    }

    fn settle_all(
        &mut self,
        touched: BTreeSet<ObjectKey>,
        fresh: &Fresh,
        refused: &mut Vec<Duplicate>,
    ) -> Vec<SourceEvent> {
        touched.into_iter().filter_map(|key| self.settle(key, fresh, refused)).collect()
    }

    /// The whole object `key` of the file at `path`: parsed this scan, or
    /// read again (a refused copy that now wins, after the first file went).
    fn whole(&self, path: &Path, key: &ObjectKey, fresh: &Fresh) -> Option<Object> {
        if let Some(object) = fresh.get(&(path.to_path_buf(), key.clone())) {
            return Some(object.clone());
        }
        let again = fs::read(path).ok().and_then(|bytes| parse_file(path, &bytes, &mut Vec::new()).ok());
        let object = again.and_then(|mut objects| objects.remove(key)).and_then(|held| held.object);
        if object.is_none() {
            warn!(object = %key, path = %path.display(), "cannot read the object again; the next scan retries");
        }
        object
    }

    /// Brings `current[key]` in line with the winning file (the first, in
    /// file name order, that has it; the others' copies are refused with a
    /// warning naming both files); the event, if any.
    fn settle(&mut self, key: ObjectKey, fresh: &Fresh, duplicates: &mut Vec<Duplicate>) -> Option<SourceEvent> {
        let mut holders = self.files.iter().filter_map(|(path, file)| file.objects.get(&key).map(|o| (path, o)));
        let first = holders.next();
        if let Some((kept, _)) = first {
            for (refused, _) in holders {
                warn!(
                    object = %key,
                    kept = %kept.display(),
                    refused = %refused.display(),
                    "the same object in two manifest files: the first file's is used, the other refused"
                );
                let detail = format!("also in {}; the copy in {} is used", refused.display(), kept.display());
                duplicates.push(Duplicate::of(&key, detail));
            }
        }
        match first {
            Some((_, held)) if self.current.get(&key) == Some(held) => None,
            Some((path, held)) => {
                let held = held.clone();
                let event = self.whole(path, &key, fresh)?.applied();
                self.current.insert(key, held);
                Some(event)
            }
            None => self.current.remove(&key).map(|held| held.object.unwrap_or_else(|| key.identity()).deleted()),
        }
    }
}

/// Bookkeeping of one scan.
#[derive(Default)]
struct Pass {
    listed: bool,
    touched: BTreeSet<ObjectKey>,
    errors: Vec<ManifestError>,
    /// The whole objects parsed this scan, by file.
    fresh: Fresh,
    /// The soonest a file left to settle is quiet enough.
    settle_again: Option<Duration>,
    refused: Vec<Duplicate>,
}

/// Whole objects by file and key.
type Fresh = BTreeMap<(PathBuf, ObjectKey), Object>;

/// A file outlined by the first scan, its objects to hand over.
struct LargeFile {
    path: PathBuf,
    bytes: Vec<u8>,
    outline: Outline,
}

impl Pass {
    fn report(&mut self, error: ManifestError) {
        warn!(%error, "manifest skipped; its last good objects stay");
        self.errors.push(error);
    }

    fn touch_differences(&mut self, old: &FileObjects, new: &FileObjects) {
        let keys = old.keys().chain(new.keys());
        let changed = keys.filter(|key| old.get(key) != new.get(key));
        self.touched.extend(changed.cloned());
    }
}

/// What was last read from one file.
#[derive(Debug, Default)]
struct CachedFile {
    /// Metadata when last read; `None` if it could not be stat'ed.
    stamp: Option<Stamp>,
    read_at: Option<SystemTime>,
    /// Hash of the content last parsed (successfully or not).
    hash: Option<u64>,
    /// The objects of the last successful parse, as [`Held::kept`] keeps them.
    objects: FileObjects,
}

/// One file's objects as its [`CachedFile`] keeps them, sorted by key: a
/// boxed slice, where a map of one object (a file per object) allocated a
/// whole B-tree node (≈ 900 bytes; at 10,000 services dual-stack, 25,001
/// files, 22 MB of the daemon's peak).
#[derive(Debug, Default)]
struct FileObjects(Box<[(ObjectKey, Held)]>);

impl FileObjects {
    fn get(&self, key: &ObjectKey) -> Option<&Held> {
        self.0.binary_search_by(|(k, _)| k.cmp(key)).ok().map(|i| &self.0[i].1)
    }

    fn keys(&self) -> impl Iterator<Item = &ObjectKey> {
        self.0.iter().map(|(key, _)| key)
    }

    fn into_keys(self) -> impl Iterator<Item = ObjectKey> {
        self.0.into_vec().into_iter().map(|(key, _)| key)
    }

    #[cfg(test)]
    fn values(&self) -> impl Iterator<Item = &Held> {
        self.0.iter().map(|(_, held)| held)
    }
}

impl FromIterator<(ObjectKey, Held)> for FileObjects {
    /// Keys once each (a map's entries).
    fn from_iter<I: IntoIterator<Item = (ObjectKey, Held)>>(iter: I) -> Self {
        let mut objects: Vec<(ObjectKey, Held)> = iter.into_iter().collect();
        objects.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
        FileObjects(objects.into_boxed_slice())
    }
}

impl CachedFile {
    fn seen(&mut self, stamp: Stamp, now: SystemTime) {
        self.stamp = Some(stamp);
        self.read_at = Some(now);
    }

    /// Whether the file is known not to have changed since it was read.
    fn is_fresh(&self, stamp: Stamp) -> bool {
        let (Some(seen), Some(read_at), Some(mtime)) = (self.stamp, self.read_at, stamp.mtime) else {
            return false;
        };
        let settled = read_at.duration_since(mtime).is_ok_and(|age| age >= RACY_WINDOW);
        seen == stamp && settled
    }
}

/// The metadata that changes when a file (or a symlink's target) changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: Option<SystemTime>,
    ctime: (i64, i64),
    dev: u64,
    ino: u64,
}

impl Stamp {
    /// How much longer a file written in place (not renamed since its last
    /// write) must stay quiet before it is read; None: read it now.
    fn settling(&self, now: SystemTime, settle: Duration) -> Option<Duration> {
        let mtime = self.mtime?;
        let ctime = SystemTime::UNIX_EPOCH
            .checked_add(Duration::new(u64::try_from(self.ctime.0).ok()?, u32::try_from(self.ctime.1).ok()?))?;
        if ctime > mtime {
            return None;
        }
        let age = now.duration_since(mtime).unwrap_or(Duration::ZERO);
        settle.checked_sub(age).filter(|wait| !wait.is_zero())
    }

    fn of(meta: &fs::Metadata) -> Self {
        Self {
            len: meta.len(),
            mtime: meta.modified().ok(),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

/// The pieces a file's content is hashed in ([`content_hash`], [`hash_file`]).
const HASH_PIECE: usize = 64 * 1024;

fn content_hash(bytes: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    bytes.chunks(HASH_PIECE).for_each(|piece| hasher.write(piece));
    hasher.finish()
}

/// [`content_hash`] of the file at `path`, read one piece at a time.
fn hash_file(path: &Path) -> io::Result<u64> {
    let mut file = fs::File::open(path)?;
    let mut hasher = DefaultHasher::new();
    let mut piece = vec![0; HASH_PIECE];
    loop {
        // A whole piece (short only at the end), as `content_hash` cuts them.
        let mut filled = 0;
        while filled < HASH_PIECE {
            match file.read(&mut piece[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
        if filled == 0 {
            return Ok(hasher.finish());
        }
        hasher.write(&piece[..filled]);
        if filled < HASH_PIECE {
            return Ok(hasher.finish());
        }
    }
}

/// Manifest files in a directory, each with its [`Stamp`] (following
/// symlinks; not the whole `fs::Metadata`: at 25,001 files a listing of
/// those was 9 MB).
type Listing = BTreeMap<PathBuf, io::Result<Stamp>>;

fn list_dir(dir: &Path) -> Result<Listing, ManifestError> {
    let read_dir_error = |source| ManifestError::ReadDir { path: dir.to_owned(), source };
    let mut listing = Listing::new();
    for entry in fs::read_dir(dir).map_err(read_dir_error)? {
        let path = entry.map_err(read_dir_error)?.path();
        if !is_manifest_name(&path) {
            continue;
        }
        match fs::metadata(&path) {
            Ok(meta) if !meta.is_file() => {}
            // A dangling symlink, or a file deleted since the listing.
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            meta => {
                listing.insert(path, meta.map(|meta| Stamp::of(&meta)));
            }
        }
    }
    Ok(listing)
}

fn is_manifest_name(path: &Path) -> bool {
    let hidden = (path.file_name()).is_none_or(|name| name.as_encoded_bytes().starts_with(b"."));
    !hidden && Format::of(path).is_some()
}

#[cfg(test)]
mod tests;
