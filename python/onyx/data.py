"""onyx.data — any dataset Transformers' Trainer takes, as the C++ Trainer reads it: a dict of
arrays it views without a copy, or rows collated per batch by the data_collator (_PerBatch), as
Transformers' DataLoaders call it."""
import warnings

def _array(v, where):
    """A numpy view of an array-like: numpy arrays and CPU torch tensors are shared, not copied
    (a copy is made only when the memory is not C-contiguous)."""
    import numpy as np
    if type(v).__module__.startswith("torch"):
        v = v.detach()
        if v.device.type != "cpu":
            raise ValueError(f"{where}: a tensor on {v.device}; onyx trains on the CPU")
        if not v.is_contiguous():
            v = v.contiguous()
        return v.numpy()
    a = np.asarray(v)
    if a.dtype == object:
        raise ValueError(f"{where}: ragged or non-numeric values (dtype object); pad them (e.g. "
                         "data_collator=DataCollatorWithPadding(tokenizer)) or pass arrays")
    return np.ascontiguousarray(a)


def _collate(features, collator, where):
    """A list of per-sample dicts as one dict of arrays: `collator` (Transformers' data collators,
    any f(list of dicts) -> dict), else stacked as Transformers' default_data_collator does
    ('label' / 'label_ids' become 'labels')."""
    import numpy as np
    if collator is not None:
        batch = collator(features)
        return {str(k): _array(v, f"{where}['{k}']") for k, v in dict(batch).items()}
    if not features:
        raise ValueError(f"{where}: empty dataset")
    out = {}
    for k in features[0]:
        vals = [f[k] for f in features]
        if isinstance(vals[0], str):
            continue  # raw text columns: not model inputs
        name = "labels" if k in ("label", "label_ids") else str(k)
        if type(vals[0]).__module__.startswith("torch"):
            import torch
            out[name] = _array(torch.stack(vals), f"{where}['{k}']")
        else:
            try:
                out[name] = np.ascontiguousarray(np.stack([np.asarray(v) for v in vals]))
            except ValueError as e:
                raise ValueError(f"{where}['{k}']: samples of different shapes ({e}); pad them, "
                                 "e.g. data_collator=DataCollatorWithPadding(tokenizer)") from None
    return out


class _PerBatch:
    """A dataset of per-sample rows whose data_collator runs per batch, when the C++ Trainer asks
    for the rows of a batch (as Transformers' DataLoader calls it: per-batch padding, fresh MLM
    masks each epoch, pad_to_multiple_of per batch). `first` is the first batch, collated here to
    learn the columns (and to give torch.onnx.export its samples)."""

    def __init__(self, rows, collator, which, keep, used, batch_size):
        self.rows, self.collator, self.which, self.keep, self.used = rows, collator, which, keep, used
        n = len(rows)
        if n == 0:
            raise ValueError(f"{which}: empty dataset")
        self.first = self.fetch(list(range(min(n, max(1, batch_size)))))
        self.size = n

    def fetch(self, indices):
        out = _collate([self.used(dict(self.rows[int(i)])) for i in indices], self.collator,
                       self.which)
        return {k: v for k, v in out.items() if self.keep is None or k in self.keep}

    input_name = "input_ids"  # the Trainer sets processing_class.model_input_names[0]

    def lengths(self, column):
        """Each row's length for group_by_length, as Transformers' LengthGroupedSampler takes it:
        a datasets.Dataset's `column` (length_column_name), else len(row[input_name])."""
        if column in (getattr(self.rows, "column_names", None) or []):
            return [int(x) for x in self.rows[column]]
        out = []
        for i in range(self.size):
            row = self.rows[i]
            if not hasattr(row, "keys") or self.input_name not in row:
                raise ValueError(f"{self.which}: Can only automatically infer lengths for datasets "
                                 f"whose items are dictionaries with an '{self.input_name}' key.")
            out.append(len(row[self.input_name]))
        return out

    def for_cpp(self):
        return ("per_batch", self.fetch, self.size, sorted(self.first), self.lengths)

    # the dict-of-arrays view the rest of the Trainer reads (samples for export)
    def __iter__(self):
        return iter(self.first)

    def __getitem__(self, k):
        return self.first[k]

    def values(self):
        return self.first.values()

    def __bool__(self):
        return True


def _for_cpp(ds):
    """What the extension takes: a dict of arrays, or a per-batch dataset's (fetch, size, keys)."""
    return ds.for_cpp() if isinstance(ds, _PerBatch) else ds


def _dataset(ds, which, collator=None, keep=None, per_batch=0, length_column=None):
    """Any dataset Transformers' Trainer takes, as the dict of arrays (first dimension = sample)
    the C++ Trainer views: a dict of numpy arrays / torch tensors (shared, not copied), a
    Hugging Face datasets.Dataset (its numeric columns; with a data_collator, the collated rows),
    or a map-style torch Dataset / any sequence of per-sample dicts. `keep`: the model's input
    names; other columns are dropped, as Transformers' remove_unused_columns does.
    `length_column`: group_by_length's; a datasets.Dataset that has it is read per batch, so
    the C++ Trainer can ask for the column (_PerBatch.lengths)."""
    if ds is None:
        return None
    labels = ("label", "label_ids", "labels")
    unused = set()

    def used(feature):  # remove_unused_columns, before the collator sees the rows
        if keep is None:
            return feature
        unused.update(k for k in feature if k not in keep and k not in labels)
        return {k: v for k, v in feature.items() if k in keep or k in labels}

    if isinstance(ds, dict):  # already batched: the collator (per-sample rows) does not apply
        out = {str(k): _array(v, f"{which}['{k}']") for k, v in ds.items()}
    elif type(ds).__module__.startswith("datasets") and hasattr(ds, "column_names"):
        if collator is None and not (per_batch and length_column in ds.column_names):
            cols = [c for c in ds.column_names if keep is None or c in keep or c in labels]
            unused.update(c for c in ds.column_names if c not in cols)
            import numpy as np
            out = {}
            table = ds.select_columns(cols).with_format("numpy")[:]  # one array per column
            for c in cols:
                col = table[c]
                if isinstance(col, list) or getattr(col, "dtype", None) == object:
                    raise ValueError(f"{which}['{c}']: samples of different lengths; pad them "
                                     "(padding='max_length' when tokenizing) or pass "
                                     "data_collator=DataCollatorWithPadding(tokenizer)")
                if col.dtype.kind in "USO":
                    continue  # text columns
                out["labels" if c in ("label", "label_ids") else c] = np.ascontiguousarray(col)
        elif per_batch:
            out = _PerBatch(ds, collator, which, keep, used, per_batch)
        else:
            out = _collate([used(ds[i]) for i in range(len(ds))], collator, which)
    elif hasattr(ds, "__getitem__") and hasattr(ds, "__len__"):
        if collator is not None and per_batch:
            out = _PerBatch(ds, collator, which, keep, used, per_batch)
        else:
            out = _collate([used(dict(ds[i])) for i in range(len(ds))], collator, which)
    else:
        raise TypeError(f"{which}: expected a dict of arrays, a datasets.Dataset or a map-style "
                        f"dataset (__getitem__ and __len__), got {type(ds).__name__}")
    if keep is not None:
        dropped = sorted(unused | {k for k in out if k not in keep})
        if dropped:
            warnings.warn(f"{which}: columns not used by the model's forward, dropped: "
                          + ", ".join(dropped))
        if not isinstance(out, _PerBatch):  # (which drops them from each batch)
            out = {k: v for k, v in out.items() if k in keep}
    return out


def _rows_of(dataset, what, columns):
    """The rows of a TRL trainer's dataset (datasets.Dataset, a list of dicts or a dict of
    columns) as a list of dicts; None stays None. `columns` names what a row holds, for the
    error."""
    if dataset is None:
        return None
    if isinstance(dataset, dict):  # a dict of columns
        keys = list(dataset)
        return [dict(zip(keys, values)) for values in zip(*(dataset[k] for k in keys))]
    try:
        return [dict(r) for r in dataset]
    except TypeError:
        raise TypeError(f"{what}: expected rows with {columns} (datasets.Dataset, a list of dicts "
                        f"or a dict of lists), got {type(dataset).__name__}") from None
