"""The bundle the traffic commands' tests compare recorded traffic with."""

import pytest

from tests.helpers import make_llama, make_tokenizer, save_model, write_manifest


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A bundle whose manifest says code accepts 0.9 (c 0.2) and chat 0.4, beside a tiny
    target; and the identities its traffic must carry."""
    from draftkit.traffic.command import bundle_identities

    root = tmp_path_factory.mktemp("bundle")
    tok = make_tokenizer()
    target = save_model(make_llama(len(tok), num_layers=1), tok, root / "target")
    path = root / "bundle"
    path.mkdir()
    write_manifest(path, target={"name": "tiny", "path": str(target), "kind": "local"},
                   domains={"code": {"alpha": 0.9, "tau": 3.1, "c": 0.2},
                            "chat": {"alpha": 0.4, "tau": 1.5}},
                   report={"temperature": 0.0})
    _, target_id, tokenizer_id, _, _ = bundle_identities(str(path))
    return path, {"target": target_id, "tokenizer": tokenizer_id}
