//! The `s3://BUCKET/PREFIX` backend: the store's calls answered with the
//! S3 client (s3_client.rs); streamed uploads are s3_put.rs's.

use crate::backend::{Backend, Entry, PageVisitor, Pager, StreamedPut, RANGES_IN_FLIGHT};
use crate::error::{Error, ErrorKind, Result};
use crate::s3_client::{store_error, S3Backend};
use crate::s3_put::S3Put;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::ops::Range;
use std::sync::Arc;

impl Backend for S3Backend {
    fn describe(&self) -> String {
        self.describe_location()
    }

    fn list_pages(&self, stream: &str, page_limit: usize, visit: &mut PageVisitor) -> Result<()> {
        let dir = self.path(stream);
        // object_store's listing is a stream that asks for the next page of
        // keys (ListObjectsV2, up to 1,000) only when the last is consumed:
        // it is driven one entry at a time, never collected. The visitor
        // runs outside the runtime, so it may itself use this store.
        let mut listed = self.store.list(Some(&dir));
        let mut pager = Pager::new(page_limit, visit);
        while let Some(meta) = self.runtime.block_on(listed.next()) {
            let meta =
                meta.map_err(|e| store_error(format!("cannot list {}", self.url(stream)), e))?;
            let Some(mut segments) = meta.location.prefix_match(&dir) else {
                continue;
            };
            // Only the stream's own objects: one segment below it.
            if let (Some(name), None) = (segments.next(), segments.next()) {
                pager.push(Entry {
                    name: name.as_ref().to_string(),
                    size_bytes: meta.size,
                })?;
            }
        }
        pager.finish()
    }

    fn list_streams(&self) -> Result<Vec<String>> {
        let prefix = self.prefix_path();
        let listed = self
            .runtime
            .block_on(self.store.list_with_delimiter(prefix.as_ref()))
            .map_err(|e| store_error(format!("cannot list {}", self.describe()), e))?;
        Ok(listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            // Names starting with '.' are the store's own (s3_put.rs).
            .filter(|name| !name.starts_with('.'))
            .collect())
    }

    fn put(&self, key: &str, data: &[u8], create_only: bool) -> Result<()> {
        self.put_owned(key, data.to_vec(), create_only)
    }

    fn put_owned(&self, key: &str, data: Vec<u8>, create_only: bool) -> Result<()> {
        let mode = if create_only {
            PutMode::Create
        } else {
            PutMode::Overwrite
        };
        let payload = PutPayload::from(Bytes::from(data));
        self.runtime
            .block_on(
                self.store
                    .put_opts(&self.path(key), payload, PutOptions::from(mode)),
            )
            .map_err(|e| store_error(format!("cannot store {}", self.url(key)), e))?;
        Ok(())
    }

    fn put_streamed(&self, key: &str) -> Result<Box<dyn StreamedPut + '_>> {
        Ok(Box::new(S3Put::new(self, key)))
    }

    fn clean_interrupted(&self, folder: &str) -> Result<usize> {
        crate::s3_put::clean_interrupted(self, folder)
    }

    fn get_range(&self, key: &str, range: Range<u64>) -> Result<Vec<u8>> {
        let bytes = self
            .runtime
            .block_on(self.store.get_range(&self.path(key), range))
            .map_err(|e| store_error(format!("cannot read {}", self.url(key)), e))?;
        Ok(bytes.to_vec())
    }

    fn get_ranges(&self, key: &str, ranges: &[Range<u64>]) -> Result<Vec<Vec<u8>>> {
        let path = self.path(key);
        let reads = futures::stream::iter(ranges.iter().cloned())
            .map(|range| self.store.get_range(&path, range))
            .buffered(RANGES_IN_FLIGHT)
            .map_ok(|bytes| bytes.to_vec())
            .try_collect();
        self.runtime
            .block_on(reads)
            .map_err(|e| store_error(format!("cannot read {}", self.url(key)), e))
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        let path = self.path(key);
        let bytes = self
            .runtime
            .block_on(async { self.store.get(&path).await?.bytes().await })
            .map_err(|e| store_error(format!("cannot read {}", self.url(key)), e))?;
        Ok(bytes.to_vec())
    }

    fn delete(&self, keys: &[String]) -> Result<()> {
        let paths: Vec<object_store::Result<Path>> =
            keys.iter().map(|k| Ok(self.path(k))).collect();
        let results: Vec<_> = self.runtime.block_on(
            self.store
                .delete_stream(futures::stream::iter(paths).boxed())
                .collect::<Vec<_>>(),
        );
        for result in results {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    return Err(store_error(
                        format!("cannot remove objects from {}", self.describe()),
                        e,
                    ))
                }
            }
        }
        Ok(())
    }

    fn multipart_begin(&self, key: &str) -> Result<String> {
        self.runtime
            .block_on(self.store.create_multipart(&self.path(key)))
            .map_err(|e| {
                store_error(
                    format!("cannot start a multipart upload to {}", self.url(key)),
                    e,
                )
            })
    }

    fn multipart_put(
        &self,
        key: &str,
        id: &str,
        first: usize,
        _offset: u64,
        chunks: &[&[u8]],
    ) -> Result<Vec<String>> {
        let path = self.path(key);
        let id = id.to_string();
        let uploads = chunks.iter().enumerate().map(|(i, chunk)| {
            let payload = PutPayload::from(Bytes::copy_from_slice(chunk));
            let (store, path, id) = (Arc::clone(&self.store), path.clone(), id.clone());
            // Spawned, so that the chunks' signing runs on both threads.
            self.runtime
                .spawn(async move { store.put_part(&path, &id, first + i, payload).await })
        });
        let handles: Vec<_> = uploads.collect();
        let mut tags = Vec::with_capacity(handles.len());
        let mut failure = None;
        for handle in handles {
            match self.runtime.block_on(handle) {
                Ok(Ok(part)) => tags.push(part.content_id),
                Ok(Err(e)) => {
                    failure = failure.or(Some(store_error(
                        format!("cannot upload to {}", self.url(key)),
                        e,
                    )))
                }
                Err(e) => {
                    failure = failure.or(Some(Error::new(
                        ErrorKind::Io,
                        format!("upload task of {} failed: {e}", self.url(key)),
                    )))
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(tags),
        }
    }

    fn multipart_complete(&self, key: &str, id: &str, tags: Vec<String>) -> Result<()> {
        let parts = tags
            .into_iter()
            .map(|content_id| PartId { content_id })
            .collect();
        self.runtime
            .block_on(
                self.store
                    .complete_multipart(&self.path(key), &id.to_string(), parts),
            )
            .map_err(|e| {
                store_error(
                    format!("cannot complete the multipart upload to {}", self.url(key)),
                    e,
                )
            })?;
        Ok(())
    }

    fn multipart_abort(&self, key: &str, id: &str) -> Result<()> {
        match self
            .runtime
            .block_on(self.store.abort_multipart(&self.path(key), &id.to_string()))
        {
            Ok(()) => Ok(()),
            Err(object_store::Error::NotFound { .. }) => Ok(()),
            // S3 answers NoSuchUpload (404) for an upload completed or aborted.
            Err(e) if e.to_string().contains("NoSuchUpload") => Ok(()),
            Err(e) => Err(store_error(
                format!(
                    "cannot abort the multipart upload {id} to {}",
                    self.url(key)
                ),
                e,
            )),
        }
    }
}
