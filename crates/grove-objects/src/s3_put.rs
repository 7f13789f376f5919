//! A streamed put to S3: the object is gathered one part at a time and
//! sent as a multipart upload, one part in flight, so memory is one part
//! whatever the object's size; an object that ends within its first part
//! is one create-only PUT instead. Each upload is recorded, before its
//! first part, in a marker object `.uploads=FOLDER/NAME` holding its id;
//! the marker goes once the upload is completed or aborted. A process
//! killed meanwhile leaves the marker, and `clean_interrupted` aborts the
//! upload it names. A kill in the one request between starting an upload
//! and recording it leaves an upload nothing records (a bucket lifecycle
//! rule, AbortIncompleteMultipartUpload, reaps those).

use crate::backend::{Backend, StreamedPut};
use crate::error::{Error, ErrorKind, Result};
use crate::s3_client::{store_error, S3Backend};
use bytes::Bytes;
use object_store::multipart::{MultipartStore, PartId};
use object_store::PutPayload;

/// Bytes of each part but the last: S3's least (5 MiB), so that a put
/// holds as little as S3 allows. Parts are sent one at a time: a part sent
/// while the next fills would need a second part's memory.
pub(crate) const STREAMED_PART_BYTES: usize = 5 << 20;

/// The folder of the markers of streamed puts into `folder` (a name no
/// caller can give: it starts with '.'; listing skips it).
fn markers_folder(folder: &str) -> String {
    format!(".uploads={folder}")
}

/// The marker key of a streamed put to `key` ("FOLDER/NAME").
fn marker_key(key: &str) -> String {
    match key.split_once('/') {
        Some((folder, name)) => format!("{}/{name}", markers_folder(folder)),
        None => markers_folder(key),
    }
}

/// A multipart upload under way.
struct Upload {
    id: String,
    marker: String,
    parts: Vec<PartId>,
}

pub(crate) struct S3Put<'a> {
    backend: &'a S3Backend,
    key: String,
    /// The part being gathered (empty, unallocated, between parts).
    buffer: Vec<u8>,
    upload: Option<Upload>,
    finished: bool,
}

impl<'a> S3Put<'a> {
    pub(crate) fn new(backend: &'a S3Backend, key: &str) -> S3Put<'a> {
        S3Put {
            backend,
            key: key.to_string(),
            buffer: Vec::new(),
            upload: None,
            finished: false,
        }
    }

    /// Starts the multipart upload and records it.
    fn begin(&mut self) -> Result<&mut Upload> {
        if self.upload.is_none() {
            let id = self.backend.multipart_begin(&self.key)?;
            let marker = marker_key(&self.key);
            if let Err(e) = self.backend.put(&marker, id.as_bytes(), false) {
                let _ = self.backend.multipart_abort(&self.key, &id);
                return Err(e);
            }
            self.upload = Some(Upload {
                id,
                marker,
                parts: Vec::new(),
            });
        }
        Ok(self.upload.as_mut().expect("the upload was just begun"))
    }

    /// Sends the gathered bytes as the next part, giving up the buffer
    /// (object_store takes it without a copy).
    fn send_part(&mut self) -> Result<()> {
        let payload = PutPayload::from(Bytes::from(std::mem::take(&mut self.buffer)));
        let (backend, key) = (self.backend, self.key.clone());
        let upload = self.begin()?;
        let index = upload.parts.len();
        let part = backend
            .runtime
            .block_on(
                backend
                    .store
                    .put_part(&backend.path(&key), &upload.id, index, payload),
            )
            .map_err(|e| store_error(format!("cannot upload to {}", backend.url(&key)), e))?;
        upload.parts.push(part);
        debug_assert!(self.buffer.is_empty());
        Ok(())
    }
}

impl StreamedPut for S3Put<'_> {
    fn write(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            if self.buffer.capacity() == 0 {
                self.buffer.reserve_exact(STREAMED_PART_BYTES);
            }
            let take = data.len().min(STREAMED_PART_BYTES - self.buffer.len());
            self.buffer.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.buffer.len() == STREAMED_PART_BYTES {
                self.send_part()?;
            }
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        if self.upload.is_none() {
            let data = std::mem::take(&mut self.buffer);
            self.backend.put_owned(&self.key, data, true)?;
            self.finished = true;
            return Ok(());
        }
        if !self.buffer.is_empty() {
            self.send_part()?;
        }
        let upload = self.upload.take().expect("a multipart put has its upload");
        let done = self
            .backend
            .runtime
            .block_on(self.backend.store.complete_multipart(
                &self.backend.path(&self.key),
                &upload.id,
                upload.parts.clone(),
            ));
        if let Err(e) = done {
            // Put back, so that dropping aborts it.
            self.upload = Some(upload);
            return Err(store_error(
                format!(
                    "cannot complete the multipart upload to {}",
                    self.backend.url(&self.key)
                ),
                e,
            ));
        }
        self.finished = true;
        // Stored whole; a marker left by a failure here only makes
        // clean_interrupted abort an upload that is gone (not an error).
        self.backend.delete(&[upload.marker])
    }
}

impl Drop for S3Put<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if let Some(upload) = self.upload.take() {
            // The marker stays if aborting fails, for clean_interrupted.
            if self.backend.multipart_abort(&self.key, &upload.id).is_ok() {
                let _ = self.backend.delete(&[upload.marker]);
            }
        }
    }
}

/// Aborts the uploads recorded under `folder`'s markers and removes the
/// markers; returns how many.
pub(crate) fn clean_interrupted(backend: &S3Backend, folder: &str) -> Result<usize> {
    let markers = backend.list(&markers_folder(folder))?;
    for marker in &markers {
        let marker_key = format!("{}/{}", markers_folder(folder), marker.name);
        let id = match backend.get(&marker_key) {
            Ok(id) => String::from_utf8(id).map_err(|_| {
                Error::new(
                    ErrorKind::Corrupt,
                    format!("{} is not an upload id", backend.url(&marker_key)),
                )
            })?,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        backend.multipart_abort(&format!("{folder}/{}", marker.name), &id)?;
        backend.delete(&[marker_key])?;
    }
    Ok(markers.len())
}
