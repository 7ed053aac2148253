//! The files of a model package, wherever they are: on disk, or named files handed over in
//! memory ([`Model::load_from_memory`](crate::Model::load_from_memory)).
//!
//! Package detection, the CTranslate2 and Marian loaders and the tokenizer search read
//! through [`PackageFiles`], so that a package given as buffers is found and loaded by the
//! same code, with the same results, as the same files in a directory.
//!
//! Paths are the same in both: on disk they are real paths; in memory the package root is
//! the empty path, so `root.join("model.bin")` names the file `model.bin`, and a Marian
//! YAML's relative paths resolve against its folder as they do on disk.
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::{Deref, Range};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::{Error, Result};

/// Where a package's files are read from.
#[derive(Clone, Default)]
pub enum PackageFiles {
    /// The file system.
    #[default]
    Disk,
    /// Files held in memory by name, the package root being the empty path.
    Memory(Arc<MemoryFiles>),
}

/// Named files copied into memory: what a model loaded from buffers keeps of them.
pub struct MemoryFiles {
    files: BTreeMap<PathBuf, FileBytes>,
}

/// A name as a relative path without `.` components; `None` for absolute paths and `..`.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::Normal(part) => out.push(part),
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

impl MemoryFiles {
    /// Copies `(name, bytes)` pairs. Names are file names as in the package's directory
    /// (`model.bin`, `config.json`; a relative path such as `vocab/x.spm` for a file a
    /// Marian YAML names so). Errors: a name that is empty, absolute or holds `..`, a
    /// name given twice, an empty file.
    pub fn copy_of<N: AsRef<str>, B: AsRef<[u8]>>(files: &[(N, B)]) -> Result<MemoryFiles> {
        let mut out = BTreeMap::new();
        for (name, bytes) in files {
            let (name, bytes) = (name.as_ref(), bytes.as_ref());
            let path = normalize(Path::new(name)).filter(|p| !p.as_os_str().is_empty()).ok_or_else(|| {
                Error::invalid_argument(format!("{name:?} is not a file name (empty, absolute or with `..`)"))
            })?;
            if out.contains_key(&path) {
                return Err(Error::invalid_argument(format!("the file {name:?} is given twice")));
            }
            if bytes.is_empty() {
                return Err(Error::invalid_argument(format!("the file {name:?} is empty")));
            }
            out.insert(path, FileBytes::copy_of(bytes)?);
        }
        Ok(MemoryFiles { files: out })
    }

    /// The file names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &Path> {
        self.files.keys().map(PathBuf::as_path)
    }

    fn get(&self, path: &Path) -> Option<&FileBytes> {
        self.files.get(&normalize(path)?)
    }
}

impl PackageFiles {
    pub fn is_file(&self, path: &Path) -> bool {
        match self {
            PackageFiles::Disk => path.is_file(),
            PackageFiles::Memory(m) => m.get(path).is_some(),
        }
    }

    /// Whether `path` is a folder (in memory: the root, or a folder some file name has).
    pub fn is_dir(&self, path: &Path) -> bool {
        match self {
            PackageFiles::Disk => path.is_dir(),
            PackageFiles::Memory(m) => {
                normalize(path).is_some_and(|dir| m.names().any(|n| n.parent().is_some_and(|p| p.starts_with(&dir))))
            }
        }
    }

    /// What is directly in the folder `dir`, sorted by path (on disk, folders too).
    pub fn list(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        match self {
            PackageFiles::Disk => {
                let entries = std::fs::read_dir(dir).map_err(|e| Error::io(format!("cannot list {}: {e}", dir.display())))?;
                let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
                paths.sort();
                Ok(paths)
            }
            PackageFiles::Memory(m) => {
                let dir = normalize(dir).unwrap_or_default();
                Ok(m.names().filter(|n| n.parent() == Some(&dir)).map(Path::to_path_buf).collect())
            }
        }
    }

    /// The whole file (borrowed when it is in memory).
    pub fn read(&self, path: &Path) -> Result<Cow<'_, [u8]>> {
        match self {
            PackageFiles::Disk => {
                std::fs::read(path).map(Cow::Owned).map_err(|e| Error::io(format!("cannot read {}: {e}", path.display())))
            }
            PackageFiles::Memory(m) => m.get(path).map(|f| Cow::Borrowed(&f[..])).ok_or_else(|| self.missing(path)),
        }
    }

    /// The file as text; not UTF-8 is an invalid model.
    pub fn read_text(&self, path: &Path) -> Result<String> {
        String::from_utf8(self.read(path)?.into_owned())
            .map_err(|_| Error::invalid_model(format!("{} is not valid UTF-8", path.display())))
    }

    /// The file's bytes without reading them all: mapped on disk, shared in memory.
    pub fn map(&self, path: &Path) -> Result<FileBytes> {
        match self {
            PackageFiles::Disk => FileBytes::open(path),
            PackageFiles::Memory(m) => m.get(path).cloned().ok_or_else(|| self.missing(path)),
        }
    }

    fn missing(&self, path: &Path) -> Error {
        Error::io(format!("{} is not among the files given", path.display()))
    }

    /// Why `what` (e.g. "the vocabulary") at `path` is not a file to read: it does not
    /// exist, is a folder or device, cannot be looked at (a loop of links), or is not among
    /// the files given in memory.
    pub fn not_a_file(&self, what: &str, path: &Path) -> Error {
        let shown = path.display();
        match self {
            PackageFiles::Memory(_) => Error::io(format!("{what} {shown} is not among {}", self.describe(path))),
            PackageFiles::Disk => match std::fs::metadata(path) {
                Ok(_) => Error::io(format!("{what} {shown} is not a regular file")),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Error::io(format!("{what} {shown} does not exist")),
                Err(e) => Error::io(format!("{what} {shown} cannot be read: {e}")),
            },
        }
    }

    /// Where `path` is, for messages: the path, or the list of the files in memory.
    pub fn describe(&self, path: &Path) -> String {
        match self {
            PackageFiles::Disk => path.display().to_string(),
            PackageFiles::Memory(m) => {
                let names: Vec<String> = m.names().map(|n| n.display().to_string()).collect();
                format!("the files given in memory ({})", names.join(", "))
            }
        }
    }
}

impl std::fmt::Debug for PackageFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PackageFiles::Disk => write!(f, "Disk"),
            PackageFiles::Memory(m) => f.debug_list().entries(m.names()).finish(),
        }
    }
}

impl PartialEq for PackageFiles {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (PackageFiles::Disk, PackageFiles::Disk) => true,
            (PackageFiles::Memory(a), PackageFiles::Memory(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// The bytes of one package file: a file on disk mapped read-only, or a file held in
/// memory, copied into an anonymous read-only mapping that belongs to the package.
///
/// Loading borrows from these bytes ([`Tensor::from_mapped`]: float32 weights read in
/// place while their layer is built); a loaded model keeps none of them (the CPU backend
/// copies the vectors it holds, packed matrices are copies, recognized sinusoid tables are
/// generated), so the mapping ends with the load and a model file rewritten in place
/// cannot fault a loaded model. Files given in memory are copied all the same: the caller's
/// buffer need not outlive the load call, whatever a backend keeps.
///
/// [`Tensor::from_mapped`]: crate::tensor::Tensor::from_mapped
#[derive(Clone)]
pub struct FileBytes {
    map: Arc<Mmap>,
    on_disk: bool,
}

impl FileBytes {
    pub fn open(path: &Path) -> Result<FileBytes> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(format!("cannot open {}: {e}", path.display())))?;
        // SAFETY: the mapping is read-only; model files are not expected to change while
        // loaded (the same contract as CTranslate2 and every mmap-based loader).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(format!("cannot map {}: {e}", path.display())))?;
        Ok(FileBytes { map: Arc::new(map), on_disk: true })
    }

    /// A copy of `bytes` that the result owns.
    pub fn copy_of(bytes: &[u8]) -> Result<FileBytes> {
        let mut map = memmap2::MmapMut::map_anon(bytes.len())
            .map_err(|e| Error::io(format!("cannot allocate {} bytes: {e}", bytes.len())))?;
        map.copy_from_slice(bytes);
        let map = map.make_read_only().map_err(|e| Error::io(format!("cannot protect a copied file: {e}")))?;
        Ok(FileBytes { map: Arc::new(map), on_disk: false })
    }

    /// The mapping, for tensors that borrow from it.
    pub fn mapping(&self) -> &Arc<Mmap> {
        &self.map
    }

    /// Drops the resident pages lying wholly inside `range`: a file's pages are read again
    /// from it when next used. A no-op for a file in memory, whose pages would come back
    /// zeroed.
    pub fn release(&self, range: Range<usize>) {
        const PAGE: usize = 4096;
        if !self.on_disk {
            return;
        }
        // The mapping starts on a page boundary, so offsets align like addresses.
        let start = range.start.next_multiple_of(PAGE);
        let end = range.end.min(self.map.len()) / PAGE * PAGE;
        if end > start {
            // SAFETY: a read-only, file-backed mapping: dropped pages are read again from
            // the file (page cache) when next accessed; the range lies inside the mapping.
            let _ = unsafe { self.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
        }
    }
}

impl Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Why a named file cannot be read says which case it is.
    #[test]
    fn what_is_not_a_file_says_why() {
        let dir = std::env::temp_dir().join(format!("tolk-not-a-file-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("folder")).unwrap();
        let disk = PackageFiles::Disk;
        assert!(disk.not_a_file("the vocabulary", &dir.join("folder")).message.ends_with("folder is not a regular file"));
        assert!(disk.not_a_file("the vocabulary", &dir.join("missing")).message.ends_with("missing does not exist"));
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(dir.join("loop"), dir.join("loop")).unwrap();
            assert!(disk.not_a_file("the shortlist", &dir.join("loop")).message.contains("loop cannot be read"));
        }
        let memory = PackageFiles::Memory(Arc::new(MemoryFiles::copy_of(&[("model.bin", b"x")]).unwrap()));
        let e = memory.not_a_file("the Marian model", Path::new("/etc/passwd"));
        assert_eq!(e.message, "the Marian model /etc/passwd is not among the files given in memory (model.bin)");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn names_are_checked_and_listed_like_a_directory() {
        let m = MemoryFiles::copy_of(&[("./model.bin", &b"ab"[..]), ("vocab/x.spm", b"c"), ("config.json", b"{}")]).unwrap();
        let files = PackageFiles::Memory(Arc::new(m));
        let root = Path::new("");
        assert!(files.is_dir(root) && files.is_dir(Path::new("vocab")) && !files.is_dir(Path::new("x")));
        assert_eq!(files.list(root).unwrap(), [PathBuf::from("config.json"), "model.bin".into()]);
        assert!(files.is_file(&root.join("model.bin")) && files.is_file(Path::new("vocab/./x.spm")));
        assert_eq!(&files.read(Path::new("model.bin")).unwrap()[..], b"ab");
        assert_eq!(files.read(Path::new("../model.bin")).unwrap_err().kind, crate::ErrorKind::Io);
        for bad in [&[("", &b"x"[..])][..], &[("/etc/x", b"x")], &[("a/../b", b"x")], &[("a", b"x"), ("./a", b"y")], &[("a", b"")]] {
            assert_eq!(MemoryFiles::copy_of(bad).err().unwrap().kind, crate::ErrorKind::InvalidArgument);
        }
    }
}
